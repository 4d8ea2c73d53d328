"""Which server owns which parameters: a ``ShardPlan``.

ps-lite (Li et al., OSDI 2014) gives each server a range of keys; MXNet's kvstore, its
descendant, keeps small arrays whole on one server and slices any array bigger than
``MXNET_KVSTORE_BIGARRAY_BOUND`` (10^6 elements) evenly across all servers, so that one huge
embedding cannot make one server the bottleneck. The same two rules here:

* a tensor of more than ``slice_threshold`` elements is cut into S nearly equal slices
  (``chunk_bounds``: the first ``n % S`` one element larger), slice i on server i, the
  first turned on by the remainders so far, so that the larger slices go round the
  servers and all sliced tensors together leave them at most one element apart;
* the other tensors go whole, largest first, to the server with the fewest elements so far
  (Graham's LPT rule). Every server then holds within one small tensor of N/S elements:
  when the last tensor x joined the fullest server, that server had the fewest, so no load
  is further than |x| from another, nor from the mean.

Each server's ``Piece``s, big ones first, laid end to end, are its flat buffer:
``pack`` gathers them from a list of tensors, ``unpack`` scatters them back. On the wire the
buffer travels as ``Segment``s: a piece of at least ``BIG_PIECE`` elements is a message of
its own, sent from and received into the parameter or gradient where it lies (no copy, as
ps-lite's zero-copy ``SArray`` does); runs of smaller pieces are packed into one message,
so a model of many small tensors does not pay one latency per tensor. ``num_servers=1`` is
the naive layout: one server, every piece of every tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import positive_int
from ...collectives.tags import chunk_bounds

DEFAULT_SLICE_THRESHOLD = 1_000_000  # MXNet's MXNET_KVSTORE_BIGARRAY_BOUND
BIG_PIECE = 1 << 15  # elements: a piece this big is a message of its own, sent in place


@dataclass(frozen=True)
class Piece:
    """Elements ``start:stop`` of the flattened parameter tensor number ``tensor``."""

    tensor: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Segment:
    """One message: elements ``start:stop`` of a server's flat buffer, holding ``pieces``."""

    start: int
    stop: int
    pieces: tuple[Piece, ...]

    @property
    def in_place(self) -> bool:
        """Sent from, and received into, the tensor itself (one big piece)."""
        return len(self.pieces) == 1 and self.pieces[0].numel >= BIG_PIECE

    def view(self, tensors: list[torch.Tensor]) -> torch.Tensor | None:
        """The piece as a view of its tensor, if in place and that tensor is contiguous."""
        t = tensors[self.pieces[0].tensor]
        if not self.in_place or not t.is_contiguous():
            return None
        return t.view(-1)[self.pieces[0].start:self.pieces[0].stop]

    def pack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The segment's elements of ``tensors``: a view when in place, else a copy."""
        view = self.view(tensors)
        if view is not None:
            return view
        return torch.cat([tensors[p.tensor].reshape(-1)[p.start:p.stop] for p in self.pieces])

    def unpack(self, flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.pieces:
                tensors[p.tensor].view(-1)[p.start:p.stop].copy_(flat[offset:offset + p.numel])
                offset += p.numel


@dataclass(frozen=True)
class ShardPlan:
    """``shards[s]``: the pieces server ``s`` owns, in the order of its flat buffer: pieces
    of ``BIG_PIECE`` elements or more first, then the small ones (so that they travel as one
    packed message), each group in (tensor, offset) order."""

    shards: tuple[tuple[Piece, ...], ...]

    @property
    def num_servers(self) -> int:
        return len(self.shards)

    def numel(self, server: int) -> int:
        """Elements server ``server`` owns: what it receives from each worker per push."""
        return sum(p.numel for p in self.shards[server])

    def sizes(self) -> list[int]:
        return [self.numel(s) for s in range(self.num_servers)]

    def pack(self, server: int, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Server ``server``'s pieces of ``tensors`` (one per parameter), as one flat tensor."""
        parts = [tensors[p.tensor].reshape(-1)[p.start:p.stop] for p in self.shards[server]]
        return torch.cat(parts) if parts else tensors[0].new_empty(0)

    def pack_into(self, server: int, tensors: list[torch.Tensor], out: torch.Tensor) -> None:
        """``pack`` into ``out`` (a flat tensor of ``numel(server)`` elements): one copy."""
        with torch.no_grad():
            for p, piece in zip(self.shards[server], self.split(server, out)):
                piece.copy_(tensors[p.tensor].reshape(-1)[p.start:p.stop])

    def unpack(self, server: int, flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
        """Copy the flat buffer ``flat`` back into server ``server``'s pieces of ``tensors``."""
        offset = 0
        with torch.no_grad():
            for p in self.shards[server]:
                tensors[p.tensor].view(-1)[p.start:p.stop].copy_(flat[offset:offset + p.numel])
                offset += p.numel

    def segments(self, server: int) -> list[Segment]:
        """The messages server ``server``'s buffer travels as (see the module docstring)."""
        out: list[Segment] = []
        run: list[Piece] = []
        offset = 0
        for p in self.shards[server]:
            if p.numel >= BIG_PIECE:
                if run:
                    out.append(Segment(offset - sum(q.numel for q in run), offset, tuple(run)))
                    run = []
                out.append(Segment(offset, offset + p.numel, (p,)))
            else:
                run.append(p)
            offset += p.numel
        if run:
            out.append(Segment(offset - sum(q.numel for q in run), offset, tuple(run)))
        return out

    def split(self, server: int, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` (server ``server``'s buffer), one per piece."""
        return list(flat.split([p.numel for p in self.shards[server]]))


def plan_shards(shapes: list[tuple[int, ...]], num_servers: int,
                slice_threshold: int | None = DEFAULT_SLICE_THRESHOLD) -> ShardPlan:
    """The plan for tensors of ``shapes`` over ``num_servers`` servers (see the module
    docstring); ``slice_threshold=None`` never slices (whole tensors only)."""
    positive_int(num_servers, "num_servers")
    sizes = [_numel(s) for s in shapes]
    shards: list[list[Piece]] = [[] for _ in range(num_servers)]
    loads = [0] * num_servers
    small, turn = [], 0  # turn: the server that gets the next one-element-larger slice
    for i, n in enumerate(sizes):
        if slice_threshold is not None and n > slice_threshold and num_servers > 1:
            bounds = chunk_bounds(n, num_servers)
            for k in range(num_servers):
                s = (turn + k) % num_servers
                shards[s].append(Piece(i, bounds[k], bounds[k + 1]))
                loads[s] += bounds[k + 1] - bounds[k]
            turn = (turn + n % num_servers) % num_servers
        else:
            small.append(i)
    for i in sorted(small, key=lambda i: (-sizes[i], i)):  # LPT: largest first
        s = min(range(num_servers), key=lambda s: (loads[s], s))
        shards[s].append(Piece(i, 0, sizes[i]))
        loads[s] += sizes[i]
    order = lambda p: (p.numel < BIG_PIECE, p.tensor, p.start)  # noqa: E731 big ones first
    ordered = tuple(tuple(sorted(sh, key=order)) for sh in shards)
    return ShardPlan(ordered)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
