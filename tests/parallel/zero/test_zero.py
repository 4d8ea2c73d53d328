"""ZeRO stages 0-3 train exactly like one process, hold the bytes the formulas predict, move
the bytes the formulas predict, and fail with errors that name the mistake.

Tolerance: as for DDP (tests/parallel/data/test_data_parallel.py), float64 models differ
from one process only in the order the per-sample gradient terms are summed (~1e-16
relative); the optimizers are per-element, so running them on a flat shard changes no
arithmetic. 1e-13 absolute on O(1) parameters is far below any real bug (a shard updated
twice, a gradient not averaged, a shard boundary off by the padding).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close, assert_replicas_bitwise, train_single
from torch import nn

import minidist as md
from minidist.costmodel.zero import zero_rank_bytes, zero_step_bytes
from minidist.parallel.zero import FlatShards, ZeRO

ATOL = 1e-13
B, STEPS = 12, 3  # global batch divisible by 1, 2, 3, 4
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 8),  # K: state bytes
              "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}, 16)}
TINY_BUCKETS = 0.0005  # MiB: stage 2 gets several buckets


class Odd(nn.Module):
    """Uneven sizes: 5*3+3 + 0 + 1 + 3*3+3 = 31 parameters (prime: no world size > 1
    divides it), one of them zero-sized and one a single element."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(5, 3)
        self.empty = nn.Parameter(torch.zeros(0))
        self.scale = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(3, 3)
        self.double()

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x)) * self.scale) + self.empty.sum()


def mlp() -> nn.Module:  # 435 parameters in 3 Linear units, nothing at the root
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3)).double()


MODELS = {"odd": Odd, "mlp": mlp}


def batches(steps: int = STEPS) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(B, 5, generator=g, dtype=torch.float64),
             torch.randn(B, 3, generator=g, dtype=torch.float64)) for _ in range(steps)]


def wrap(comm, name: str, stage: int, opt: str) -> ZeRO:
    model = MODELS[name]()
    cls, kwargs, _ = OPTIMIZERS[opt]
    units = [model.lin, model.head] if name == "odd" else None  # the root keeps the rest
    return ZeRO(model, comm, stage=stage, optimizer_class=cls, bucket_cap_mb=TINY_BUCKETS,
                units=units, **kwargs)


def train(z: ZeRO, comm, data) -> None:
    for x, y in data:
        loss = F.mse_loss(z(x.chunk(comm.world_size)[comm.rank]),
                          y.chunk(comm.world_size)[comm.rank])
        loss.backward()
        z.step()
        z.zero_grad()


# -- equivalence with one process, memory against the formulas ---------------------------------
def _equivalence_rank(comm):
    out = {}
    for name in MODELS:
        for opt in OPTIMIZERS:
            for stage in range(4):
                z = wrap(comm, name, stage, opt)
                train(z, comm, batches())
                full = z.full_parameters()
                assert_replicas_bitwise(comm, full)
                out[name, opt, stage] = (full, z.memory(), [g.numel for g in z.groups])
    return out


def expected_memory(numels: list[int], p: int, stage: int, k: int, opt: str) -> dict:
    """zero_rank_bytes for float64 (8-byte parameters and gradients, K bytes of state),
    plus AdamW's scalar ``step`` counter (a 4-byte float32 tensor per shard)."""
    want = zero_rank_bytes(numels, p, stage, param_bytes=8, grad_bytes=8, optimizer_bytes=k)
    if opt == "adamw":
        want["optimizer"] += 4 * len(numels)
        want["total"] += 4 * len(numels)
    return want


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_matches_single_process_and_memory_formula(world_size):
    results = md.launch(_equivalence_rank, world_size, timeout=60)
    for name, make in MODELS.items():
        for opt, (cls, kwargs, k) in OPTIMIZERS.items():
            want = list(train_single(make, batches(), optimizer_class=cls, **kwargs)
                        .params.values())
            psi = sum(t.numel() for t in want)
            for stage in range(4):
                for rank in range(world_size):
                    full, mem, numels = results[rank][name, opt, stage]
                    assert_params_close(full, want, atol=ATOL)
                    assert sum(numels) == psi  # every parameter sharded exactly once
                    exact = expected_memory(numels, world_size, stage, k, opt)
                    assert {n: mem[n] for n in exact} == exact, (name, opt, stage, mem)
                    # the paper's formula (exact quotients, fp16 -> float64 bytes) within
                    # one padding of each group per part (plus AdamW's step counters)
                    paper = md.costmodel.zero_memory(psi, world_size, stage, optimizer_bytes=k)
                    pad = sum(-n % world_size for n in numels)
                    assert abs(mem["params"] - 4 * paper["params"]) <= 8 * pad
                    assert abs(mem["grads"] - 4 * paper["grads"]) <= 8 * pad
                    steps = 4 * len(numels) if opt == "adamw" else 0
                    assert abs(mem["optimizer"] - steps - paper["optimizer"]) <= k * pad


# -- stage 3: gathered one unit at a time; 1.5x the bytes of stages 1 and 2 ---------------------
def _stage3_rank(comm):
    z = wrap(comm, "mlp", 3, "sgd")
    units = [z.module[0], z.module[2], z.module[4]]
    seen = []
    for u in units:  # registered after ZeRO's pre-hook: runs once the unit is gathered
        u.register_forward_pre_hook(
            lambda _m, _a: seen.append([p.numel() > 0 for u in units for p in u.parameters()]))
    x, y = batches(1)[0]
    F.mse_loss(z(x), y).backward()
    peak = z.memory()["params_peak"]  # before step resets it
    z.step()
    between = [p.numel() for p in z.module.parameters()]
    sent = {}
    for stage in (1, 2, 3):
        zs = wrap(comm, "mlp", stage, "sgd")
        train(zs, comm, batches(1))  # warm-up: optimizer state exists
        before = comm.stats.bytes_sent
        train(zs, comm, batches(1))
        sent[stage] = (comm.stats.bytes_sent - before, [g.numel for g in zs.groups])
    shards = 8 * sum(g.shard_numel for g in z.groups)
    largest = 8 * max(g.padded for g in z.groups)
    return seen, between, sent, (peak, shards + largest)


@pytest.mark.parametrize("world_size", [2, 3])
def test_stage3_gathers_layer_by_layer_and_moves_1_5x(world_size):
    for seen, between, sent, (peak, want_peak) in md.launch(_stage3_rank, world_size,
                                                            timeout=60):
        assert peak == want_peak  # the shards plus the largest unit, never two units
        assert seen == [[True, True, False, False, False, False],  # only the running unit
                        [False, False, True, True, False, False],
                        [False, False, False, False, True, True]]
        assert between == [0] * 6  # between steps: only the shards are held
        for stage, (nbytes, numels) in sent.items():
            assert nbytes == zero_step_bytes(numels, world_size, stage, 8)
        ratio = sent[3][0] / sent[1][0]
        pad = world_size * len(sent[3][1]) / sum(sent[3][1])  # relative size of the padding
        assert abs(ratio - 1.5) <= 1.5 * pad, ratio


# -- the small GPT, tied head counted once ----------------------------------------------------
CFG = md.models.GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)


def gpt() -> nn.Module:
    return md.models.GPT(CFG).double()


def gpt_loss(model, x, y):
    return model(x, y)[1]


def tokens():
    return md.models.synthetic_tokens(2, 4, CFG.block_size, CFG.vocab_size, seed=3)


def _gpt_rank(comm):
    out = {}
    for stage in range(4):
        z = md.ZeRO(gpt(), comm, stage=stage, optimizer_class=torch.optim.AdamW, lr=1e-2,
                 bucket_cap_mb=0.01)
        for x, y in tokens():
            r, p = comm.rank, comm.world_size
            before = comm.stats.bytes_sent
            gpt_loss(z, x.chunk(p)[r], y.chunk(p)[r]).backward()
            z.step()
            z.zero_grad()
            if stage:  # stage 3: the root (embedding, tied head) is gathered once per step
                assert comm.stats.bytes_sent - before == z.predicted_step_bytes()
        out[stage] = (z.full_parameters(), [g.numel for g in z.groups], z.memory())
    return out


def test_gpt_with_tied_weights_trains_like_one_process():
    want = list(train_single(gpt, tokens(), optimizer_class=torch.optim.AdamW, lr=1e-2,
                             loss_fn=gpt_loss).params.values())
    psi = gpt().num_params()  # the tied embedding and head count once
    for rank_out in md.launch(_gpt_rank, 2, timeout=60):
        for stage, (full, numels, mem) in rank_out.items():
            assert sum(numels) == psi
            assert_params_close(full, want, atol=ATOL)
            want_mem = expected_memory(numels, 2, stage, 16, "adamw")
            assert {n: mem[n] for n in want_mem} == want_mem


# -- the flat layout --------------------------------------------------------------------------
def test_flat_shards_layout():
    params = [nn.Parameter(torch.arange(6.0).view(2, 3)), nn.Parameter(torch.zeros(0)),
              nn.Parameter(torch.tensor([6.0, 7.0]))]
    g = FlatShards(params, world_size=3, rank=2)
    assert (g.numel, g.padded, g.shard_numel, g.padding) == (8, 9, 3, 1)
    assert [g.bounds(r) for r in range(3)] == [(0, 3), (3, 6), (6, 9)]
    flat = g.pack([p.detach() for p in params])
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0]  # zero padding at the end
    assert g.shard_of(flat).tolist() == [6, 7, 0]
    assert [tuple(v.shape) for v in g.views(flat)] == [(2, 3), (0,), (2,)]
    with pytest.raises(TypeError, match="one dtype and device"):
        FlatShards([params[0], nn.Parameter(torch.zeros(2, dtype=torch.float64))], 2, 0)


def test_zero_rank_bytes_reproduces_the_papers_figure_1():
    gb = [zero_rank_bytes([int(7.5e9)], 64, s)["total"] / 1e9 for s in range(4)]
    assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]
    for s in range(4):  # equal to md.costmodel.zero_memory when nothing needs padding
        assert zero_rank_bytes([64 * 1000], 64, s)["total"] == \
            md.costmodel.zero_memory(64 * 1000, 64, s)["total"]
    assert zero_step_bytes([100], 4, 3, 2) == 1.5 * zero_step_bytes([100], 4, 1, 2)


# -- md.ZeRO builds one class per stage --------------------------------------------------------
def _stage_classes_rank(comm):
    from minidist.parallel.zero import ZeROStage0, ZeROStage1, ZeROStage2, ZeROStage3

    direct = [cls(mlp(), comm) for cls in (ZeROStage0, ZeROStage1, ZeROStage2, ZeROStage3)]
    out = {"built": [type(ZeRO(mlp(), comm, stage=k)).__name__ for k in range(4)],
           "positional": type(ZeRO(mlp(), comm, 1, torch.optim.SGD, lr=0.1)).__name__,
           "default": type(ZeRO(mlp(), comm)).__name__,
           "direct": [(z.stage, isinstance(z, ZeRO), isinstance(z, md.ZeRO)) for z in direct],
           "gatherer": [hasattr(z, "gatherer") for z in direct]}
    try:
        ZeROStage1(mlp(), comm, stage=2)
    except ValueError as e:
        out["mismatch"] = str(e)
    return out


def test_zero_builds_the_class_of_its_stage():
    got = md.launch(_stage_classes_rank, 2, timeout=60)[0]
    assert got["built"] == ["ZeROStage0", "ZeROStage1", "ZeROStage2", "ZeROStage3"]
    assert got["positional"] == "ZeROStage1" and got["default"] == "ZeROStage2"
    assert got["direct"] == [(k, True, True) for k in range(4)]  # a stage's class: its stage
    assert got["gatherer"] == [False, False, False, True]  # stage 3's alone
    assert "ZeROStage1 is ZeRO stage 1" in got["mismatch"] and "stage=2" in got["mismatch"]


# -- errors -------------------------------------------------------------------------------------
def _errors_rank(comm):
    got = {}
    cases = {
        "stage": lambda: ZeRO(mlp(), comm, stage=4),
        "stage_bool": lambda: ZeRO(mlp(), comm, stage=True),
        "optimizer": lambda: ZeRO(mlp(), comm, optimizer_class=torch.optim.SGD(
            mlp().parameters(), lr=0.1)),
        "not_optimizer": lambda: ZeRO(mlp(), comm, optimizer_class=dict),
        "bucket": lambda: ZeRO(mlp(), comm, bucket_cap_mb=0),
        "dtypes": lambda: ZeRO(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double()), comm,
                               stage=1),
        "units": lambda: ZeRO(mlp(), comm, stage=3, units=[nn.Linear(2, 2)]),
        "step": lambda: ZeRO(mlp(), comm, stage=2, lr=0.1).step(),
    }
    for name, fn in cases.items():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (collected to check type and message)
            got[name] = (type(e).__name__, str(e))
    z = ZeRO(mlp(), comm, stage=1, optimizer_class=torch.optim.SGD, lr=0.1)
    F.mse_loss(z(torch.randn(2, 5, dtype=torch.float64)), torch.zeros(2, 3,
                                                                    dtype=torch.float64)).backward()
    z.step()
    try:
        z.step()  # no backward since the last step
    except RuntimeError as e:
        got["step_twice"] = ("RuntimeError", str(e))
    return got


def test_bad_input_raises_clear_errors():
    got = md.launch(_errors_rank, 2, timeout=60)[0]
    assert got["stage"][0] == "ValueError" and "stage must be one of 0, 1, 2, 3" in got["stage"][1]
    assert got["stage_bool"][0] == "ValueError"
    assert got["optimizer"][0] == "TypeError" and "not an instance" in got["optimizer"][1]
    assert got["not_optimizer"][0] == "TypeError" and "optimizer_class" in got["not_optimizer"][1]
    assert got["bucket"][0] == "ValueError" and "bucket_cap_mb" in got["bucket"][1]
    assert got["dtypes"][0] == "TypeError" and "one dtype" in got["dtypes"][1]
    assert got["units"][0] == "ValueError" and "submodules" in got["units"][1]
    for case in ("step", "step_twice"):
        assert got[case][0] == "RuntimeError" and "before backward" in got[case][1]


# -- stage 3 with prefetch: same results and bytes, two units held at once ----------------------
def _prefetch_rank(comm):
    out = {}
    for name, make, loss_fn, data in (("mlp", mlp, mse_of, batches()), ("gpt", gpt, gpt_loss,
                                                                        tokens())):
        z = ZeRO(make(), comm, stage=3, optimizer_class=torch.optim.AdamW, prefetch=True,
                 lr=1e-2)
        peaks, sent = [], []
        for x, y in data:
            r, p = comm.rank, comm.world_size
            before = comm.stats.bytes_sent
            loss_fn(z, x.chunk(p)[r], y.chunk(p)[r]).backward()
            peaks.append(z.memory()["params_peak"])
            z.step()
            z.zero_grad()
            sent.append(comm.stats.bytes_sent - before == z.predicted_step_bytes())
        units = sorted(8 * g.padded for k, g in enumerate(z.groups) if k != z.gatherer.root)
        root = 8 * z.groups[z.gatherer.root].padded if z.gatherer.root is not None else 0
        shards = 8 * sum(g.shard_numel for g in z.groups)
        out[name] = (z.full_parameters(), peaks, sent, (shards + root, units))
    return out


def mse_of(model, x, y):
    return F.mse_loss(model(x), y)


def test_stage3_prefetch_trains_alike_holding_two_units():
    want = {"mlp": train_single(mlp, batches(), optimizer_class=torch.optim.AdamW, lr=1e-2),
            "gpt": train_single(gpt, tokens(), optimizer_class=torch.optim.AdamW, lr=1e-2,
                                loss_fn=gpt_loss)}
    for rank_out in md.launch(_prefetch_rank, 2, timeout=60):
        for name, (full, peaks, sent, (base, units)) in rank_out.items():
            assert_params_close(full, list(want[name].params.values()), atol=ATOL)
            assert all(sent)  # prefetch moves the same bytes, only earlier
            # the next unit arrives while the current one is held: more than one unit, never
            # more than the two largest
            assert base + units[-1] < max(peaks) <= base + units[-1] + units[-2]
