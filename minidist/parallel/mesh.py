"""``DeviceMesh``: the ranks laid out as an n-dimensional grid with a named communicator for
every dimension, as torch's ``init_device_mesh`` and picotron's process-group manager do.

    mesh = md.DeviceMesh(comm, {"dp": 2, "pp": 2, "tp": 2})
    mesh["tp"]          # the communicator of this rank's tensor-parallel group (2 ranks)
    mesh.coords         # {"dp": 0, "pp": 1, "tp": 1} on rank 3
    mesh.ranks("pp")    # [1, 3]: the ranks of ``comm`` in this rank's pipeline group

Layout. Row-major with the last dimension fastest (C order, torch's and numpy's): rank =
sum_d coord_d * stride_d, stride_d = product of the sizes after d. So with ``{"dp": 2, "pp":
2, "tp": 2}`` the tp pairs are adjacent ranks (0 1), (2 3), ...; pp pairs are 2 apart and dp
pairs 4 apart. Which dimension goes last matters on a real cluster: ranks 0-7 usually share
one node and its fast links (NVLink, hundreds of GB/s) while nodes talk over InfiniBand (tens
of GB/s). Megatron-LM's PTD-P rule (Narayanan et al., SC 2021, section 3) follows from each
dimension's traffic: tensor parallelism all-reduces activations 4 times per block per micro-
batch, so it goes last (inside a node); pipeline parallelism sends one activation per micro-
batch between neighbours, so it can cross nodes; data parallelism all-reduces the gradients
once per step, and goes first (outermost).

Groups. A rank's group along dimension d is every rank that shares all its other
coordinates: ``size_d`` ranks, ``world / size_d`` groups. Each is one ``comm.split``: the
color names the group (the rank whose coordinate d is 0) and the key orders it by coordinate
d, so ``mesh[d].rank == mesh.coords[d]``. Building the mesh costs one split, i.e. one small
all-gather of (color, key) pairs, per dimension; every rank must build it.

The functions below the class (``coords_of``, ``rank_of``, ``group_of``, ``groups``) do the
arithmetic with no communicator, for drawing a mesh or planning one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..checks import integer


class DeviceMesh:
    """The ranks of ``comm`` as a grid of ``shape`` (name -> size, outermost first), with a
    sub-communicator per dimension (``mesh[name]``). Collective: call it on every rank."""

    def __init__(self, comm, shape: Mapping[str, int]):
        self.comm = comm
        self.shape: dict[str, int] = check_shape(shape, comm.world_size)
        self.names: tuple[str, ...] = tuple(self.shape)
        self.coords: dict[str, int] = coords_of(comm.rank, self.shape)
        self._groups = {name: self._split(name) for name in self.names}

    def _split(self, name: str):
        members = group_of(self.comm.rank, self.shape, name)
        return self.comm.split(color=members[0], key=self.coords[name])

    def __getitem__(self, name: str):
        """The communicator of this rank's group along dimension ``name``."""
        self._check_name(name)
        return self._groups[name]

    def __contains__(self, name: object) -> bool:
        return name in self.shape

    def size(self, name: str | None = None) -> int:
        """The size of dimension ``name``, or of the whole mesh (torch's ``mesh.size()``)."""
        if name is None:
            return math.prod(self.shape.values())
        self._check_name(name)
        return self.shape[name]

    def ranks(self, name: str) -> list[int]:
        """The ranks of ``comm`` in this rank's group along ``name``, by coordinate."""
        self._check_name(name)
        return group_of(self.comm.rank, self.shape, name)

    def _check_name(self, name) -> None:
        if name not in self.shape:
            raise KeyError(f"DeviceMesh has no dimension {name!r}; its dimensions are "
                           f"{list(self.names)}")

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in self.shape.items())
        return f"DeviceMesh({dims}; rank {self.comm.rank} at {self.coords})"


def check_shape(shape: Mapping[str, int], world_size: int) -> dict[str, int]:
    """``shape`` as a dict, or a ValueError/TypeError naming what is wrong with it."""
    if not isinstance(shape, Mapping) or not shape:
        raise TypeError(f"shape must be a non-empty dict of dimension name -> size, e.g. "
                        f"{{'dp': 2, 'tp': 2}}; got {shape!r}")
    for name, size in shape.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"mesh dimension names must be non-empty strings, got {name!r}")
        integer(size, f"the size of mesh dimension {name!r}")
    total = math.prod(shape.values())
    if total != world_size:
        sizes = " x ".join(f"{s} ({n})" for n, s in shape.items())
        raise ValueError(f"mesh shape {dict(shape)} holds {sizes} = {total} ranks but the "
                         f"communicator has world_size={world_size}; the sizes must "
                         f"multiply to the world size")
    return dict(shape)


def strides(shape: Mapping[str, int]) -> dict[str, int]:
    """Row-major strides: the last dimension 1, each one before it the product after it."""
    out, step = {}, 1
    for name in reversed(list(shape)):
        out[name], step = step, step * shape[name]
    return dict(reversed(list(out.items())))


def coords_of(rank: int, shape: Mapping[str, int]) -> dict[str, int]:
    """The coordinates of ``rank`` in a row-major mesh of ``shape`` (last dimension fastest)."""
    if not 0 <= rank < math.prod(shape.values()):
        raise ValueError(f"rank {rank} is outside a mesh of {math.prod(shape.values())} ranks")
    return {name: rank // stride % shape[name] for name, stride in strides(shape).items()}


def rank_of(coords: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """The rank at ``coords`` (every dimension of ``shape`` given): the inverse of coords_of."""
    for name, size in shape.items():
        if name not in coords or not 0 <= coords[name] < size:
            raise ValueError(f"coordinate {name}={coords.get(name)!r} is not in range(size) "
                             f"for a mesh of shape {dict(shape)}")
    return sum(coords[name] * stride for name, stride in strides(shape).items())


def group_of(rank: int, shape: Mapping[str, int], name: str) -> list[int]:
    """The ranks that share every coordinate of ``rank`` except ``name``, by that coordinate."""
    if name not in shape:
        raise KeyError(f"mesh has no dimension {name!r}; its dimensions are {list(shape)}")
    coords = coords_of(rank, shape)
    return [rank_of({**coords, name: i}, shape) for i in range(shape[name])]


def groups(shape: Mapping[str, int], name: str) -> list[list[int]]:
    """Every group along dimension ``name``: ``world / size`` lists of ``size`` ranks."""
    world = math.prod(shape.values())
    return [g for r in range(world) if (g := group_of(r, shape, name))[0] == r]
