"""The public collectives: ``md.broadcast``, ``md.reduce``, ``md.all_reduce``, ...

Each one checks that every rank called it alike (``common.agree``), then checks its
arguments (the same on every rank, so every rank raises the same error), then runs its
algorithm. Tensors are torch tensors (CPU or CUDA) or numpy arrays, of any shape and length;
what a collective returns is of the kind it was given. ``op`` is one of ``ops.OPS``; how
float16/bfloat16 accumulate is in ``ops.py``.

Each is one communication call on the rank's clock (``@bracketed``, ``transports/clock.py``):
under virtual time what the algorithm does between its messages (slicing, adding) is part
of the call, not computation charged to the caller, as the alpha-beta formulas (gamma = 0)
count it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..comm import tensors
from ..transports.clock import bracketed
from . import allreduce, auto, hierarchical, ops
from . import shared_memory as shm_collectives
from .agreement import agree, describe
from .rooted import all_to_all_pairwise, broadcast_tree, gather_linear, reduce_tree, scatter_linear
from .tags import TAG, as_flat, check_root, chunk_bounds

ALGORITHMS = {"naive": allreduce.naive, "tree": allreduce.tree, "ring": allreduce.ring,
              "recursive_doubling": allreduce.recursive_doubling,
              "halving_doubling": allreduce.halving_doubling,
              "hierarchical": hierarchical.hierarchical,  # two-level: hierarchical.py
              "topology_ring": hierarchical.topology_ring}
ALL_REDUCE_ALGORITHMS = (*ALGORITHMS, "auto")


@bracketed
def all_reduce(comm, t, op: str = "sum", algorithm: str = "auto"):
    """Reduce ``t`` over all ranks, in place; returns ``t``. Every rank gets the same bits.

    ``algorithm``: one of ``ALL_REDUCE_ALGORITHMS`` (costs in ``allreduce.py``;
    ``"hierarchical"`` and ``"topology_ring"`` use the node layout: ``hierarchical.py``);
    ``"auto"`` picks by size and world size from measured figures or the described
    network's links, or a backend's own fast path (``auto.py``).
    """
    agree(comm, describe("all_reduce", t, op=op, algorithm=algorithm))
    x = as_flat(t, "all_reduce tensor")
    _check_all_reduce(x, op, algorithm, "all_reduce")
    _all_reduce_flat(comm, x, op, algorithm)
    return t


@bracketed
def all_reduce_coalesced(comm, tensors_, op: str = "sum", algorithm: str = "auto",
                         buffer: torch.Tensor | None = None):
    """Reduce a list of tensors of one dtype as one all_reduce of their concatenation
    (torch's ``all_reduce_coalesced``), in place; returns the list.

    One latency for many small tensors, as DDP's buckets do. Where ``auto`` takes the
    shared-memory path the tensors are reduced where they lie; otherwise they are copied
    into one flat buffer (``buffer`` if given, large enough, else a new one) and back.
    """
    xs = [as_flat(t, "all_reduce_coalesced tensor") for t in tensors_]
    total = sum(x.numel() for x in xs)
    head = xs[0] if xs else torch.empty(0)
    agree(comm, describe("all_reduce_coalesced", head, shape=(len(xs), total), op=op,
                         algorithm=algorithm))
    if any(x.dtype != head.dtype or x.device != head.device for x in xs):
        raise TypeError("all_reduce_coalesced: the tensors must share one dtype and device")
    _check_all_reduce(head, op, algorithm, "all_reduce_coalesced")
    if comm.world_size == 1 or not total:
        return list(tensors_)
    nbytes = total * head.element_size()
    if algorithm == "auto" and auto.choose(comm, head, nbytes) == "shm":
        shm_collectives.all_reduce_shm(comm, xs, op)  # where they lie: no copies
        for x in xs:
            ops.finish_(x, op, comm.world_size)
        return list(tensors_)
    flat = buffer[:total] if buffer is not None and buffer.numel() >= total else \
        torch.empty(total, dtype=head.dtype, device=head.device)
    torch.cat(xs, out=flat)
    _all_reduce_flat(comm, flat, op, algorithm)
    for x, part in zip(xs, flat.split([x.numel() for x in xs])):
        x.copy_(part)
    return list(tensors_)


def _check_all_reduce(x: torch.Tensor, op: str, algorithm: str, what: str) -> None:
    ops.check_op(op, x.dtype, what)
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"{what}: unknown algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALL_REDUCE_ALGORITHMS)}")


def _all_reduce_flat(comm, x: torch.Tensor, op: str, algorithm: str) -> None:
    """The all_reduce itself, on a flat tensor the ranks have agreed on."""
    if comm.world_size == 1:
        return
    if algorithm == "auto":
        auto.all_reduce_auto(comm, x, op, ALGORITHMS)
    else:
        ALGORITHMS[algorithm](comm, x, op)
    ops.finish_(x, op, comm.world_size)  # every path sums for avg; one division, here


@bracketed
def broadcast(comm, t, src: int = 0):
    """Copy rank ``src``'s ``t`` into ``t`` on every rank, in place; returns ``t``.
    Binomial tree (``basic.broadcast_tree``)."""
    agree(comm, describe("broadcast", t, src=src))
    x, src = as_flat(t, "broadcast tensor"), check_root(src, comm, "src")
    broadcast_tree(comm, x, src, TAG["broadcast"])
    return t


@bracketed
def reduce(comm, t, dst: int = 0, op: str = "sum"):
    """Reduce ``t`` over all ranks into ``t`` on rank ``dst``; returns ``t``. Other ranks'
    ``t`` is left unchanged. Binomial tree (``basic.reduce_tree``)."""
    agree(comm, describe("reduce", t, dst=dst, op=op))
    x, dst = as_flat(t, "reduce tensor"), check_root(dst, comm, "dst")
    ops.check_op(op, x.dtype, "reduce")
    reduce_tree(comm, x, op, dst, TAG["reduce"])
    if comm.rank == dst:
        ops.finish_(x, op, comm.world_size)
    return t


@bracketed
def reduce_scatter(comm, t, op: str = "sum"):
    """Reduce ``t`` over all ranks and return this rank's shard of the result: rank r gets
    piece r of ``t`` cut along its first axis into p nearly equal pieces (the first
    ``len % p`` one row longer, as ``torch.tensor_split``). ``t`` is left unchanged.
    Ring reduce-scatter: (p-1) (alpha + n/p beta + n/p gamma); bytes sent: n minus its shard.
    """
    agree(comm, describe("reduce_scatter", t, op=op))
    x = tensors.as_tensor(t, "reduce_scatter tensor")
    ops.check_op(op, x.dtype, "reduce_scatter")
    if x.dim() == 0:
        raise ValueError("reduce_scatter: the tensor has no axis to split; pass at least 1-D")
    p, r, rows = comm.world_size, comm.rank, x.shape[0]
    row_bounds = chunk_bounds(rows, p)
    bounds = [b * (x[0].numel() if rows else 0) for b in row_bounds]
    work = x.reshape(-1).clone()
    allreduce.ring_reduce_scatter(comm, work, bounds, op, TAG["reduce_scatter"])
    shard = work[bounds[r]:bounds[r + 1]].reshape(row_bounds[r + 1] - row_bounds[r],
                                                  *x.shape[1:])
    return _like(t, ops.finish_(shard.clone(), op, p))  # a copy: frees the other p-1 pieces


@bracketed
def all_gather(comm, t):
    """Every rank's ``t``, stacked along a new first axis: shape ``(p, *t.shape)``.
    Ring all-gather: (p-1) (alpha + n beta); bytes sent: (p-1) n."""
    agree(comm, describe("all_gather", t))
    x = tensors.as_tensor(t, "all_gather tensor")
    p, n = comm.world_size, x.numel()
    out = torch.empty((p, *x.shape), dtype=x.dtype, device=x.device)
    out[comm.rank].copy_(x)
    allreduce.ring_all_gather(comm, out.reshape(-1), [k * n for k in range(p + 1)],
                              TAG["all_gather"])
    return _like(t, out)


@bracketed
def gather(comm, t, dst: int = 0):
    """On ``dst``, every rank's ``t`` stacked along a new first axis (shape
    ``(p, *t.shape)``); ``None`` on the other ranks. Linear (``basic.gather_linear``)."""
    agree(comm, describe("gather", t, dst=dst))
    x, dst = tensors.as_tensor(t, "gather tensor"), check_root(dst, comm, "dst")
    out = None
    if comm.rank == dst:
        out = torch.empty((comm.world_size, *x.shape), dtype=x.dtype, device=x.device)
    out = gather_linear(comm, x, out, dst, TAG["gather"])
    return None if out is None else _like(t, out)


@bracketed
def scatter(comm, t, src: int = 0):
    """Rank ``src`` passes ``t`` of shape ``(p, *s)`` and rank k receives piece ``t[k]``.
    The other ranks pass the buffer to receive into (shape ``s``), as torch.distributed's
    scatter does. Returns the piece (on ``src`` a copy of ``t[src]``). Linear
    (``basic.scatter_linear``)."""
    shape, pieces = _piece_shape(t) if comm.rank == src else (None, comm.world_size)
    agree(comm, describe("scatter", t, shape=shape, pieces=pieces, src=src))
    x, src = tensors.as_tensor(t, "scatter tensor"), check_root(src, comm, "src")
    if comm.rank != src:
        return _like(t, scatter_linear(comm, None, x, src, TAG["scatter"]))
    if x.dim() == 0 or x.shape[0] != comm.world_size:
        raise ValueError(f"scatter: rank {src} must pass one piece per rank along the first "
                         f"axis, shape ({comm.world_size}, ...); got {tuple(x.shape)}")
    out = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
    return _like(t, scatter_linear(comm, x, out, src, TAG["scatter"]))


@bracketed
def all_to_all(comm, t):
    """Rank r sends ``t[j]`` to rank j and returns a tensor whose row i came from rank i
    (``t`` has shape ``(p, *s)``: the transpose of who-sends-what). Pairwise exchange
    (``basic.all_to_all_pairwise``)."""
    agree(comm, describe("all_to_all", t))
    x = tensors.as_tensor(t, "all_to_all tensor")
    if x.dim() == 0 or x.shape[0] != comm.world_size:
        raise ValueError(f"all_to_all: pass one row per rank along the first axis, shape "
                         f"({comm.world_size}, ...); got {tuple(x.shape)}")
    out = torch.empty_like(x)
    return _like(t, all_to_all_pairwise(comm, x, out, TAG["all_to_all"]))


def _piece_shape(t):
    shape = getattr(t, "shape", None)
    if shape is None or len(shape) == 0:
        return None, 0
    return tuple(shape[1:]), shape[0]


def _like(t, out: torch.Tensor):
    """Return numpy for numpy input, torch otherwise."""
    return out.numpy() if isinstance(t, np.ndarray) else out
