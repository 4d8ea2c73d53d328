"""Tests of exercise 07: a device mesh built by hand. ``mesh_coords`` (a rank's place in a
row-major grid), ``mesh_groups`` (one sub-communicator per dimension, from ``comm.split``)
and, as the stretch part, ``sync_gradients`` (gradients averaged over the dp dimension only).

The reference is torch's ``init_device_mesh`` layout (``mesh_probe.py``): ranks in C order,
the last dimension fastest, and along dimension d one group of every rank that shares all
its other coordinates, ordered by its d coordinate. ``mesh_groups`` runs in launched worlds
of 6 and 8 ranks on 3D, 2D and 1D shapes, names in any order; every group it returns
all-reduces a one-hot vector of the global rank, so a wrong group is named by the ranks it
really holds. ``md.DeviceMesh``, the mesh module's arithmetic, ``HybridGPT`` and torch's
``init_device_mesh`` are out of reach (the sandbox's ``MESH`` rule).
"""

from __future__ import annotations

import numbers

import torch

from ..engine.data import contributors
from ..engine.feedback import Mistake
from ..engine.sandbox import MESH
from ..engine.spec import GradedTest
from .mesh_probe import (
    column_major_group,
    grads_of,
    groups_case,
    reference_coords,
    reference_group,
    reference_mesh,
    same_coordinate,
    sync_case,
)

COORD_SHAPES = [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 2}, {"pp": 3, "tp": 2},
                {"dp": 2, "pp": 3, "tp": 4}, {"tp": 2, "dp": 3}, {"dp": 1, "pp": 8},
                {"dp": 2, "pp": 1, "tp": 4}, {"dp": 5}, {"dp": 1, "tp": 1}]
GROUP_CASES = {8: [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 2}, {"pp": 1, "tp": 8},
                   {"dp": 2, "pp": 1, "tp": 4}, {"tp": 2, "dp": 4}],
               6: [{"dp": 3, "tp": 2}, {"pp": 2, "dp": 3}, {"dp": 1, "pp": 3, "tp": 2}]}
SYNC_CASES = {8: [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 2, "tp": 4}, {"tp": 2, "dp": 4}],
              6: [{"pp": 2, "dp": 3}, {"dp": 3, "pp": 1, "tp": 2}]}


def _strides(shape: dict) -> dict:
    out, step = {}, 1
    for name in reversed(list(shape)):
        out[name], step = step, step * shape[name]
    return {name: out[name] for name in shape}


def _rule(shape: dict, name: str) -> str:
    """Where the ranks of one ``name`` group lie, in words."""
    if name == list(shape)[-1]:
        return (f"{name} is the last (fastest) dimension, so {name} neighbours are adjacent "
                "ranks")
    return (f"{name} neighbours are {_strides(shape)[name]} ranks apart (the product of the "
            f"sizes after {name})")


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
                          f"{_coords_hint(coords, rank, shape)}")
    return (f"torch's init_device_mesh layout (row-major, last dimension fastest) for every "
            f"rank of {len(COORD_SHAPES)} shapes of 1 to 24 ranks")


def _as_coords(got, shape: dict, label: str) -> dict:
    """A dict name -> int; a list or tuple of ints in the shape's order is the same answer."""
    if isinstance(got, (list, tuple)) and len(got) == len(shape):
        got = dict(zip(shape, got))
    ok = isinstance(got, dict) and list(got) == list(shape) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in got.values())
    if not ok:
        raise Mistake(f"with {label}: mesh_coords returned {got!r:.80}, expected a dict of "
                      f"dimension name -> coordinate with the keys {list(shape)}, in order")
    return {k: int(v) for k, v in got.items()}


def _coords_hint(got: dict, rank: int, shape: dict) -> str:
    strides = _strides(shape)
    flipped = dict(reversed(list(shape.items())))
    if got == reference_coords(rank, flipped):
        return ("that is a mesh with the FIRST dimension fastest. Ranks are laid out "
                "row-major (C order, as torch.arange(world).reshape(sizes)): the LAST "
                f"dimension is fastest, so rank {rank} and rank {rank + 1} differ in "
                f"{list(shape)[-1]} first")
    if got == {n: rank // s for n, s in strides.items()}:
        return ("rank // stride counts every step of the dimensions before it too: take it "
                "modulo the dimension's size, (rank // stride) % size")
    return (f"coordinate d is (rank // stride_d) % size_d, where stride_d is the product of "
            f"the sizes after d: here the strides are {strides}")


# -- mesh_groups -------------------------------------------------------------------------------
def check_mesh_groups(learner) -> str:
    for world, shapes in GROUP_CASES.items():
        labels = [f"world_size={world}, shape={s}" for s in shapes]
        ranks = learner.run_ranks(groups_case, world, [(dict(s),) for s in shapes],
                                  "mesh_groups", labels)
        for k, (shape, label) in enumerate(zip(shapes, labels)):
            results = [ranks[r][k]["value"] for r in range(world)]
            _judge_groups(results, shape, label)
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
                              f"{_group_hint(rank, shape, name, got['members'])}")
            if got["rank"] != want.index(rank):
                raise Mistake(
                    f"with {label}: rank {rank} is rank {got['rank']} in its {name} group "
                    f"{want}, where it should be rank {want.index(rank)}, its {name} "
                    f"coordinate: ranks in a group are numbered from 0 by the key of "
                    f"comm.split; order each group by the coordinate along its dimension")


def _group_hint(rank: int, shape: dict, name: str, members: list[int]) -> str:
    world, size = reference_mesh(shape).numel(), shape[name]
    others = {n: c for n, c in reference_coords(rank, shape).items() if n != name}
    rule = (f"a rank's {name} group is every rank that shares all its other coordinates "
            f"({others}); {_rule(shape, name)}")
    if members == [rank] and size > 1:
        return (f"rank {rank} is alone in its group, so no other rank passed its color: ranks "
                f"of one group must pass the same color (one number per group, such as its "
                f"first rank); {rule}")
    if members == list(range(world)):
        return (f"every rank passed the same color; the color must differ between the "
                f"{world // size} {name} groups; {rule}")
    if members == same_coordinate(rank, shape, name):
        return (f"those are the ranks whose {name} coordinate equals rank {rank}'s. Are the "
                f"color and the key swapped? The color names the group (what its members "
                f"share: every other coordinate); the key orders the ranks inside it (the "
                f"{name} coordinate); {rule}")
    other = next((n for n in shape if n != name and shape[n] > 1 and
                  members == reference_group(rank, shape, n)), None)
    found = [f"rank {rank}'s {other} group"] if other else []
    if members == column_major_group(rank, shape, name):
        found.append(f"the {name} group of a mesh laid out with the FIRST dimension fastest "
                     "(ranks are laid out row-major, the last dimension fastest)")
    return f"that is {' and '.join(found)}; {rule}" if found else rule


# -- sync_gradients (stretch) ------------------------------------------------------------------
def check_sync_gradients(learner) -> str:
    for world, shapes in SYNC_CASES.items():
        labels = [f"world_size={world}, shape={s}" for s in shapes]
        ranks = learner.run_ranks(sync_case, world, [(dict(s),) for s in shapes],
                                  "sync_gradients", labels)
        for k, (shape, label) in enumerate(zip(shapes, labels)):
            for rank in range(world):
                _judge_sync(ranks[rank][k]["value"], rank, shape, label)
    return ("every gradient the average over its dp group only, in place, in 5 meshes of "
            "6 and 8 ranks")


def _expected(rank: int, shape: dict) -> list[torch.Tensor]:
    world, dp = reference_mesh(shape).numel(), reference_group(rank, shape, "dp")
    return [sum(g[j] for g in (grads_of(r, world) for r in dp)) / len(dp)
            for j in range(len(grads_of(0, world)))]


def _judge_sync(got: dict, rank: int, shape: dict, label: str) -> None:
    want, world = _expected(rank, shape), reference_mesh(shape).numel()
    for j, (g, w) in enumerate(zip(got["grads"], want)):
        close = torch.isclose(g, w, rtol=1e-12, atol=1e-9)
        if bool(close.all()):
            continue
        i = int((~close).flatten().nonzero()[0])
        value = float(g.flatten()[i])
        where = (f"with {label}: rank {rank}'s gradient {j}, value [{i}] = {value:g}, "
                 f"expected {float(w.flatten()[i]):g}")
        raise Mistake(f"{where}: {_sync_hint(got, rank, shape, (j, i, value), world)}")


def _sync_hint(got: dict, rank: int, shape: dict, at, world: int) -> str:
    j, i, value = at
    dp = reference_group(rank, shape, "dp")
    why = ("only the dp ranks hold the same parameters (the same shard of the same stage), "
           "each with the gradient of its own slice of the batch; the tp ranks hold other "
           "shards and the pp ranks other layers")
    if torch.equal(got["grads"][j], grads_of(rank, world)[j]):
        returned = got["returned"]
        if returned and len(returned) > j and torch.allclose(returned[j], _expected(
                rank, shape)[j]):
            return ("the right averages, returned as new tensors; write them into the "
                    "gradients given (in place: md.all_reduce writes into its tensor), as "
                    "the optimizer reads param.grad")
        return (f"the gradient is unchanged: average it in place over the dp group "
                f"{dp} (md.all_reduce(groups['dp'], grad, op='avg'))")
    for divisor in sorted({len(dp), 1, world, *shape.values()}):
        total = value * divisor
        if abs(total - round(total)) > 1e-6:
            continue
        ranks = contributors(round(total), i, world)
        if ranks is None:
            continue
        if ranks == dp:
            how = "not its average" if divisor == 1 else f"divided by {divisor}"
            return (f"that is the sum over the dp group {dp}, {how}: average, i.e. divide "
                    f"by the group's size, {len(dp)} (or all-reduce with op='avg')")
        named = next((f"rank {rank}'s {n} group" for n in shape
                      if ranks == reference_group(rank, shape, n)), None)
        named = named or ("every rank: all-reducing over each dimension in turn covers the "
                          "whole mesh" if len(ranks) == world else "not one of its groups")
        return (f"it combines the gradients of ranks {ranks} ({named}), where it should "
                f"average those of its dp group {dp}: {why}")
    return f"expected the average over rank {rank}'s dp group {dp}: {why}"


TESTS = [  # in notebook order
    GradedTest("test_mesh_coords", 2, ("mesh_coords",), check_mesh_coords, rules=(MESH,)),
    GradedTest("test_mesh_groups", 4, ("mesh_groups",), check_mesh_groups, rules=(MESH,)),
    GradedTest("test_sync_gradients", 3, ("sync_gradients",), check_sync_gradients,
               rules=(MESH,), part="stretch"),
]
