"""Exercise 07's tests: a rank's coordinates in the mesh, the groups ``mesh_groups`` builds
(every group all-reduces a one-hot vector of the global rank, so a wrong group is named by
the ranks it really holds) and gradients averaged over the dp groups only, by exactly one
all-reduce per gradient (or one of them all) on the dp group (``ranks.record_calls``)."""

from __future__ import annotations

import math
import numbers

from ...engine.compare import Tolerance, isclose
from ...engine.feedback import Mistake
from .mistakes import coords_hint, group_hint, sync_hint
from .ranks import (
    GRAD_SHAPES,
    expected_grads,
    groups_case,
    reference_coords,
    reference_group,
    reference_mesh,
    sync_case,
)

COORD_SHAPES = [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 2}, {"pp": 3, "tp": 2},
                {"dp": 2, "pp": 3, "tp": 4}, {"pp": 2, "dp": 3, "tp": 2}, {"tp": 2, "dp": 3},
                {"dp": 1, "pp": 8}, {"dp": 2, "pp": 1, "tp": 4}, {"dp": 5}, {"dp": 1, "tp": 1}]
GROUP_CASES = {8: [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 2}, {"pp": 1, "tp": 8},
                   {"dp": 2, "pp": 1, "tp": 4}, {"tp": 2, "dp": 4}],
               6: [{"dp": 3, "tp": 2}, {"pp": 2, "dp": 3}, {"dp": 1, "pp": 3, "tp": 2}]}
TOLERANCE = Tolerance(1e-12, 1e-9)  # averages of exact integers over a group
SYNC_CASES = {8: [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 2, "tp": 4}, {"tp": 2, "dp": 4}],
              6: [{"pp": 2, "dp": 3}, {"dp": 3, "pp": 1, "tp": 2}]}


# -- mesh_coords -------------------------------------------------------------------------------
def check_mesh_coords(learner) -> str:
    calls = [(r, dict(s)) for s in COORD_SHAPES for r in range(reference_mesh(s).numel())]
    labels = [f"rank={r}, shape={s}" for r, s in calls]
    results = learner.call_each("mesh_coords", calls, labels)
    for (rank, shape), label, got in zip(calls, labels, results):
        want = reference_coords(rank, shape)
        coords = _as_coords(got, shape, label)
        if coords != want:
            raise Mistake(f"with {label}: mesh_coords returned {coords}, expected {want}; "
                          f"{coords_hint(coords, rank, shape)}")
    return (f"torch's init_device_mesh layout (row-major, last dimension fastest) for every "
            f"rank of {len(COORD_SHAPES)} shapes of 1 to 24 ranks")


def _as_coords(got, shape: dict, label: str) -> dict:
    """A dict name -> int; a list or tuple of ints in the shape's order is the same answer."""
    if isinstance(got, (list, tuple)) and len(got) == len(shape):
        got = dict(zip(shape, got))
    ok = isinstance(got, dict) and list(got) == list(shape) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in got.values())
    if isinstance(got, dict) and list(got) == list(shape) and not ok:
        kinds = sorted({type(v).__name__ for v in got.values()})
        raise Mistake(f"with {label}: mesh_coords returned {got!r:.80}, whose coordinates are "
                      f"{', '.join(kinds)}; expected Python ints: use integer division, "
                      "rank // stride (/ gives a float), and int(...) on a tensor's element")
    if not ok:
        raise Mistake(f"with {label}: mesh_coords returned {got!r:.80}, expected a dict of "
                      f"dimension name -> coordinate with the keys {list(shape)}, in order")
    return {k: int(v) for k, v in got.items()}


# -- mesh_groups -------------------------------------------------------------------------------
def _label(world: int, shape: dict) -> str:
    return f"world_size={world}, shape={shape}"


def _worlds(cases: dict) -> dict:
    return {world: [(dict(s),) for s in shapes] for world, shapes in cases.items()}


def check_mesh_groups(learner) -> str:
    for _, (shape,), label, results in learner.each_world(
            groups_case, "mesh_groups", _worlds(GROUP_CASES), _label):
        _judge_groups([r["value"] for r in results], shape, label)
    n = sum(len(s) for s in GROUP_CASES.values())
    return (f"every group of every dimension holds the ranks of torch's init_device_mesh, in "
            f"its order, in {n} meshes of 6 and 8 ranks")


def _judge_groups(results: list[dict], shape: dict, label: str) -> None:
    for rank, result in enumerate(results):
        if result.get("problem"):
            raise Mistake(f"with {label}: on rank {rank}, {result['problem']}")
    for name in shape:
        for rank, result in enumerate(results):
            got, want = result["groups"][name], reference_group(rank, shape, name)
            if got["members"] != want:
                raise Mistake(f"with {label}: the {name} group of rank {rank} holds ranks "
                              f"{got['members']} where it should hold {want}: "
                              f"{group_hint(rank, shape, name, got['members'])}")
            if got["rank"] != want.index(rank):
                raise Mistake(
                    f"with {label}: rank {rank} is rank {got['rank']} in its {name} group "
                    f"{want}, where it should be rank {want.index(rank)}, its {name} "
                    f"coordinate: ranks in a group are numbered from 0 by the key of "
                    f"comm.split; order each group by the coordinate along its dimension")


# -- sync_gradients (stretch) ------------------------------------------------------------------
def check_sync_gradients(learner) -> str:
    for _, (shape,), label, results in learner.each_world(
            sync_case, "sync_gradients", _worlds(SYNC_CASES), _label):
        for rank, result in enumerate(results):
            _judge_sync(result["value"], rank, shape, label)
    return ("every gradient the average over its dp group only, in place, by one "
            "all-reduce per gradient (or one of them all) on the dp group and nothing else, "
            "in 5 meshes of 6 and 8 ranks")


def _judge_sync(got: dict, rank: int, shape: dict, label: str) -> None:
    want, world = expected_grads(rank, shape), reference_mesh(shape).numel()
    for j, (g, w) in enumerate(zip(got["grads"], want)):
        close = isclose(g, w, TOLERANCE)
        if bool(close.all()):
            continue
        i = int((~close).flatten().nonzero()[0])
        value = float(g.flatten()[i])
        where = (f"with {label}: rank {rank}'s gradient {j}, value [{i}] = {value:g}, "
                 f"expected {float(w.flatten()[i]):g}")
        if j in (got.get("replaced") or []):
            raise Mistake(f"{where}: the list's entry {j} was replaced by a new tensor, so the "
                          "caller's tensor (a model's p.grad) never changed: average each "
                          'gradient in place (md.all_reduce(group, g, op="avg") writes into g, '
                          "or g.copy_(...))")
        raise Mistake(f"{where}: {sync_hint(got, rank, shape, (j, i, value), world)}")
    _check_sync_calls(got["calls"], rank, label)


def _check_sync_calls(calls: list, rank: int, label: str) -> None:
    """The right averages, by exactly the communication they need: one all-reduce per
    gradient, of its size (or one of them all: a flat buffer or md.all_reduce_coalesced), on
    the dp group, and nothing else."""
    sizes = [math.prod(s) if isinstance(s, tuple) else s for s in GRAD_SHAPES]
    on_dp = all(c["group"] == "dp" for c in calls)
    reduces = all(c["name"] in ("all_reduce", "all_reduce_coalesced") for c in calls)
    numel = sorted(c["numel"] for c in calls)
    if on_dp and reduces and (numel == sorted(sizes) or numel == [sum(sizes)]):
        return
    said = ", ".join(f"md.{c['name']} of {c['numel']} elements on the {c['group']} group"
                     if c["group"] != "another communicator" else
                     f"md.{c['name']} of {c['numel']} elements on another communicator"
                     for c in calls) or "no collective"
    raise Mistake(f"with {label}: the averages are right, but rank {rank}'s sync_gradients "
                  f"called {said}; averaging {len(sizes)} gradients of {sizes} elements needs "
                  "exactly one md.all_reduce per gradient, of its size, on groups['dp'] (or "
                  "one of them all, flattened), and no other collective: each extra call is "
                  "another round of latency on every step")



