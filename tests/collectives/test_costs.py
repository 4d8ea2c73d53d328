"""``costmodel/collectives.py``: the bytes each rank sends are exactly what ``comm.stats`` counts,
for every algorithm and collective, world sizes 1..8, awkward lengths and several dtypes; the
times reduce to the textbook formulas (Thakur, Rabenseifner and Gropp 2005; Patarasuk and
Yuan 2009); ``auto`` chooses what the formulas predict, from the shipped or a loaded table."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch

import minidist as md
from minidist.collectives import auto
from minidist.collectives import shared_memory as shm_collectives
from minidist.costmodel import collectives as costs

LENGTHS = [0, 1, 2, 3, 5, 7, 13, 24, 97, 840, 1031]  # primes; 24 and 840: every p <= 8
DTYPES = [torch.float32, torch.float16, torch.int64, torch.float64]
ALGOS = ["naive", "tree", "ring", "recursive_doubling", "halving_doubling"]


def _cases(p):
    """(name, n elements, dtype, kwargs, shape) batched into one launch per world size."""
    cases = []
    for i, n in enumerate(LENGTHS):
        dtype, other = DTYPES[i % len(DTYPES)], DTYPES[(i + 1) % len(DTYPES)]
        cases += [(a, n, d, {}, (n,)) for a in ALGOS for d in (dtype, other)]
        cases.append(("shm", n, dtype, {}, (n,)))
        for root in sorted({0, p // 2, p - 1}):
            cases += [(c, n, dtype, {"root": root}, (n,))
                      for c in ("broadcast", "reduce", "gather", "scatter")]
        cases += [("all_gather", n, dtype, {}, (n,)), ("all_to_all", n, dtype, {}, (p, n)),
                  ("reduce_scatter", n, dtype, {}, (n,)),
                  ("reduce_scatter", 3 * n, other, {"row": 3}, (n, 3))]
    piece = costs.shm_piece_bytes(p) // 4  # float32 elements in one piece: 3 pieces
    cases.append(("shm", 2 * piece + 11, torch.float32, {}, (2 * piece + 11,)))
    return cases


def _run(comm, name, dtype, kw, shape):
    x = torch.ones(shape, dtype=dtype)
    root = kw.get("root", 0)
    if name in ALGOS:
        md.all_reduce(comm, x, algorithm=name)
    elif name == "shm":
        shm_collectives.all_reduce_shm(comm, x, "sum")
    elif name in ("broadcast", "reduce"):
        getattr(md, name)(comm, x, root)
    elif name == "gather":
        md.gather(comm, x, dst=root)
    elif name == "scatter":
        md.scatter(comm, torch.ones((comm.world_size, *shape), dtype=dtype)
                   if comm.rank == root else x, src=root)
    else:
        getattr(md, name)(comm, x)


def _measure(comm, cases):
    out = []
    for name, _, dtype, kw, shape in cases:
        if name == "shm" and not shm_collectives.available(comm, torch.empty(0)):
            out.append(None)
            continue
        comm.stats.reset()
        _run(comm, name, dtype, kw, shape)
        out.append((comm.stats.bytes_sent, comm.stats.bytes_received))
    return out


@pytest.mark.parametrize("p", range(1, 9))
def test_bytes_sent_equal_the_cost_functions(p):
    cases = _cases(p)
    out = md.launch(_measure, p, args=(cases,))
    for i, (name, n, dtype, kw, _) in enumerate(cases):
        if out[0][i] is None:  # shm needs two ranks
            assert p == 1
            continue
        sent = [o[i][0] for o in out]
        want = [costs.bytes_sent(name, n, dtype.itemsize, p, r, **kw) for r in range(p)]
        assert sent == want, (name, n, dtype, kw)
        assert sum(sent) == sum(o[i][1] for o in out), (name, n, dtype, kw)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_times_reduce_to_the_textbook_formulas(p):
    a, b, g, lg = 3e-6, 2e9, 1e-10, math.log2(p)
    n = 1024 * p * 8  # bytes, divisible by p
    want = {"ring": 2 * (p - 1) * a + 2 * (p - 1) / p * n / b + (p - 1) / p * n * g,
            "halving_doubling": 2 * lg * a + 2 * (p - 1) / p * n / b + (p - 1) / p * n * g,
            "recursive_doubling": lg * (a + n / b + n * g),
            "tree": 2 * lg * (a + n / b) + lg * n * g,
            "naive": 2 * (p - 1) * (a + n / b) + (p - 1) * n * g,
            "shm": 2 * a + 2 * (p - 1) / p * n / b + (p - 1) / p * n * g,
            "broadcast": lg * (a + n / b), "reduce": lg * (a + n / b + n * g),
            "reduce_scatter": (p - 1) * (a + n / p / b + n / p * g),
            "all_gather": (p - 1) * (a + n / b), "gather": (p - 1) * (a + n / b),
            "scatter": (p - 1) * (a + n / b), "all_to_all": (p - 1) * (a + n / b)}
    assert set(want) == set(costs.ALL_REDUCE_PATHS + costs.COLLECTIVES)
    for name, t in want.items():
        assert costs.time(name, n, p, a, b, g) == pytest.approx(t, rel=1e-12), name
        assert getattr(costs, f"{name}_time")(n, p, a, b, g) == pytest.approx(t, rel=1e-12)
    assert costs.ring_time(n, p, a, b) == pytest.approx(2 * (p - 1) * a + 2 * (p - 1) / p * n / b)


def test_folding_and_trivial_worlds():
    a, b, n = 1e-6, 1e9, 6000.0
    # p = 6 folds onto p' = 4: 2 more messages, 2n more bytes (Thakur et al. 2005)
    assert costs.recursive_doubling_time(n, 6, a, b) == pytest.approx(4 * a + 4 * n / b)
    assert costs.halving_doubling_time(n, 6, a, b) == pytest.approx(6 * a + (1.5 + 2) * n / b)
    assert costs.tree_time(n, 5, a, b) == pytest.approx(6 * (a + n / b))  # ceil(lg 5) = 3
    for name in costs.ALL_REDUCE_PATHS + costs.COLLECTIVES:
        assert costs.time(name, n, 1, a, b, 1.0) == 0, name  # one rank: nothing to do
    piece = costs.shm_piece_bytes(4)
    assert costs.shm_time(2 * piece + 1, 4, a, b) == pytest.approx(
        6 * a + 1.5 * (2 * piece + 1) / b)  # two barriers per piece, three pieces


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_critical_path_bytes_are_what_every_rank_sends(p):
    """Where every rank does the same work, the bytes of the time formula are the bytes each
    rank sends (n divisible by p; halving-doubling needs p a power of two)."""
    n, size = 840, 4
    names = ["ring", "shm", "reduce_scatter", "all_gather", "all_to_all"]
    names += ["halving_doubling", "recursive_doubling"] if p & (p - 1) == 0 else []
    for name in names:
        want = costs.terms(name, n * size, p).bytes
        assert [costs.bytes_sent(name, n, size, p, r) for r in range(p)] == [want] * p, name
    assert costs.bytes_sent("broadcast", n, size, p, 0) == costs.terms("broadcast", n * size,
                                                                        p).bytes


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no cost formula for 'rign'"):
        costs.time("rign", 10, 2, 1e-6, 1e9)
    with pytest.raises(ValueError, match="world size p"):
        costs.ring_time(10, 0, 1e-6, 1e9)
    with pytest.raises(ValueError, match="size n"):
        costs.terms("ring", -1, 2)
    with pytest.raises(ValueError, match="rank 4 is outside a world of 4"):
        costs.bytes_sent("ring", 10, 4, 4, 4)
    with pytest.raises(TypeError, match="integer"):
        costs.bytes_sent("ring", 2.5, 4, 4, 0)
    with pytest.raises(ValueError, match="no byte count"):
        costs.bytes_sent("allreduce", 10, 4, 4, 0)


# --- auto: the choice by formulas and fitted constants --------------------------------

def _comm(p, shm=True):
    """What ``choose`` looks at: a world communicator of the local backend."""
    caps = {"shared_scratch": types.SimpleNamespace(nbytes=(p + 1) << 22) if shm else None}
    return types.SimpleNamespace(world_size=p, is_world=True, capability=caps.get)


@pytest.fixture
def table_reset(monkeypatch):
    monkeypatch.delenv("MINIDIST_COSTS", raising=False)
    auto.load_costs(None)
    yield
    auto.load_costs(None)


def _predicted(p, nbytes, shm=True):
    table = auto.costs_table()
    fit = table[min(table, key=lambda q: abs(math.log2(q / p)))]
    paths = [a for a in fit if shm or a != "shm"]
    return min(paths, key=lambda a: costs.time(a, nbytes, p, *fit[a]))


def test_shipped_table_loads_and_names_every_path(table_reset):
    data = json.loads(auto.DEFAULT_COSTS.read_text())
    assert {"machine", "date", "source", "fit"} <= set(data)
    table = auto.read_costs(auto.DEFAULT_COSTS)
    assert set(table) == {2, 4}
    for fit in table.values():
        assert set(fit) == set(costs.ALL_REDUCE_PATHS)
        assert all(alpha > 0 and beta > 0 for alpha, beta in fit.values())
    # same predictions as the whole-call fit it was converted from: t = alpha + n / beta
    for p, paths in data["call_fits"].items():
        for a, c in paths.items():
            for n in (4, 65536, 1 << 20):
                t = c["alpha_us"] * 1e-6 + n / (c["beta_GBps"] * 1e9)
                assert costs.time(a, n, int(p), *table[int(p)][a]) == pytest.approx(t, rel=1e-3)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_auto_picks_what_the_formulas_predict(table_reset, p):
    x = torch.empty(0)
    for nbytes in (4, 4096, 1 << 16, 1 << 19, 1 << 22, 1 << 26):
        for shm in (True, False):
            assert auto.choose(_comm(p, shm), x, nbytes) == _predicted(p, nbytes, shm)
    assert auto.choose(_comm(2), x, 8) == "recursive_doubling"  # the shipped table
    assert auto.choose(_comm(2), x, 16 << 20) == "shm"
    assert auto.choose(_comm(2, shm=False), x, 16 << 20) == "ring"


def _custom(path, ring_alpha):
    fit = {"2": {"ring": {"alpha": ring_alpha, "beta": 1e10},
                 "tree": {"alpha": 1e-5, "beta": 1e9}, "gloo": {"alpha": 1, "beta": 1}}}
    path.write_text(json.dumps({"machine": {}, "date": "today", "fit": fit}))
    return path


def test_a_loaded_table_changes_the_choice(table_reset, tmp_path, monkeypatch):
    x, comm = torch.empty(0), _comm(2)
    assert auto.choose(comm, x, 8) == "recursive_doubling"
    table = auto.load_costs(_custom(tmp_path / "a.json", 1e-9))
    assert table == {2: {"ring": (1e-9, 1e10), "tree": (1e-5, 1e9)}}  # unknown paths skipped
    assert auto.choose(comm, x, 8) == "ring" and auto.choose(_comm(8), x, 8) == "ring"
    auto.load_costs(None)
    monkeypatch.setenv("MINIDIST_COSTS", str(_custom(tmp_path / "b.json", 1.0)))
    assert auto.choose(comm, x, 8) == "tree"
    picks = md.launch(lambda c: auto.choose(c, torch.ones(2)), 2)  # ranks inherit it
    assert picks == ["tree", "tree"]


def test_bad_tables_are_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match='"fit" section'):
        auto.load_costs(bad)
    bad.write_text(json.dumps({"fit": {"2": {"ring": {"alpha": -1, "beta": 1e9}}}}))
    with pytest.raises(ValueError, match=r"fit\[2\]\[ring\] needs alpha >= 0"):
        auto.read_costs(bad)
    bad.write_text(json.dumps({"fit": {"2": {"shm": {"alpha": 1e-6, "beta": 1e9}}}}))
    with pytest.raises(ValueError, match="names no all_reduce algorithm"):
        auto.read_costs(bad)
    bad.write_text(json.dumps({"fit": {"two": {}}}))
    with pytest.raises(ValueError, match="not a positive integer"):
        auto.read_costs(bad)
