"""Exercise 07's hints: what a wrong coordinate, a wrong group or a wrong average is, in
terms of the layout or the group that gives it (the first dimension fastest, colour and key
swapped, another dimension's group, the sum for the average)."""

from __future__ import annotations

import torch

from ...engine.data import contributors
from .ranks import (
    column_major_group,
    expected_grads,
    grads_of,
    reference_coords,
    reference_group,
    reference_mesh,
    same_coordinate,
)


def mesh_strides(shape: dict) -> dict:
    out, step = {}, 1
    for name in reversed(list(shape)):
        out[name], step = step, step * shape[name]
    return {name: out[name] for name in shape}


def _rule(shape: dict, name: str) -> str:
    """Where the ranks of one ``name`` group lie, in words."""
    if name == list(shape)[-1]:
        return (f"{name} is the last (fastest) dimension, so {name} neighbours are adjacent "
                "ranks")
    return (f"{name} neighbours are {mesh_strides(shape)[name]} ranks apart (the product of the "
            f"sizes after {name})")


def coords_hint(got: dict, rank: int, shape: dict) -> str:
    strides = mesh_strides(shape)
    flipped = dict(reversed(list(shape.items())))
    if got == reference_coords(rank, flipped):
        return ("that is a mesh with the FIRST dimension fastest. Ranks are laid out "
                "row-major (C order, as torch.arange(world).reshape(sizes)): the LAST "
                f"dimension is fastest, so rank {rank} and rank {rank + 1} differ in "
                f"{list(shape)[-1]} first")
    if got == {n: rank // s for n, s in strides.items()}:
        return ("rank // stride counts every step of the dimensions before it too: take it "
                "modulo the dimension's size, (rank // stride) % size")
    if got == {n: rank // (s * shape[n]) % shape[n] for n, s in strides.items()}:
        return ("the strides are one dimension off: stride_d is the product of the sizes "
                "AFTER d, not counting d's own size (the last dimension's stride is 1): here "
                f"the strides are {strides}")
    if len(shape) > 1 and got == {n: rank % shape[n] for n in shape}:
        return ("rank % size is the coordinate of the last dimension only: divide by the "
                "dimension's stride first, (rank // stride) % size, with stride the product "
                f"of the sizes after it: here the strides are {strides}")
    ordered = {n: shape[n] for n in sorted(shape)}
    if list(ordered) != list(shape) and got == reference_coords(rank, ordered):
        return ("that is the layout of the dimensions sorted by name: the mesh's dimensions "
                f"are in the order shape gives them ({list(shape)}; a dict keeps its order), "
                "whatever their names, the last one fastest")
    return (f"coordinate d is (rank // stride_d) % size_d, where stride_d is the product of "
            f"the sizes after d: here the strides are {strides}")


def group_hint(rank: int, shape: dict, name: str, members: list[int]) -> str:
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


def sync_hint(got: dict, rank: int, shape: dict, at, world: int) -> str:
    j, i, value = at
    dp = reference_group(rank, shape, "dp")
    why = ("only the dp ranks hold the same parameters (the same shard of the same stage), "
           "each with the gradient of its own slice of the batch; the tp ranks hold other "
           "shards and the pp ranks other layers")
    if torch.equal(got["grads"][j], grads_of(rank, world)[j]):
        returned = got["returned"]
        if returned and len(returned) > j and torch.allclose(returned[j], expected_grads(
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
