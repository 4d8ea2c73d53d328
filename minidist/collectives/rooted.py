"""The algorithms behind broadcast, reduce, gather, scatter and all_to_all.

Same cost model and notation as ``allreduce.py`` (n: bytes of one rank's tensor, or of one
piece for gather/scatter/all_to_all). all_gather and reduce_scatter are the two halves of
ring all_reduce and live there (``ring_all_gather``, ``ring_reduce_scatter``).
"""

from __future__ import annotations

import torch

from . import ops


def broadcast_tree(comm, x: torch.Tensor, root: int, tag: int) -> torch.Tensor:
    """Binomial-tree broadcast of ``root``'s ``x``: receive from my parent, then send to my
    children, farthest first (so the largest subtree starts soonest).

    Cost: ceil(lg p) (alpha + n beta). Bytes sent: n to each child, so ceil(lg p) n by the
    root, (p-1) n by all ranks together, and every other rank receives n exactly once.
    """
    p, v = comm.world_size, (comm.rank - root) % comm.world_size
    mask = 1
    while mask < p:
        if v & mask:
            comm.collective.recv(x, (v - mask + root) % p, tag)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < p:
            comm.collective.send(x, (v + mask + root) % p, tag)
        mask >>= 1
    return x


def reduce_tree(comm, x: torch.Tensor, op: str, root: int, tag: int) -> torch.Tensor:
    """Binomial-tree reduce into ``x`` on ``root``; other ranks' ``x`` is left as it was.

    In round k, ranks (numbered from the root) whose bit k is set send their partial result
    to the rank 2^k below and drop out. A node with children keeps one accumulator for them
    (float32 for 16-bit floats). Cost: ceil(lg p) (alpha + n beta + n gamma).
    Bytes sent: n by every rank but the root, (p-1) n in all.
    """
    p = comm.world_size
    v, acc, mask = (comm.rank - root) % p, None, 1
    while mask < p:
        if v & mask:  # my subtree is complete: hand it to my parent and stop
            comm.collective.send(x if acc is None else acc.to(x.dtype), (v - mask + root) % p, tag)
            return x
        if v + mask < p:
            if acc is None:
                acc, buf = ops.accumulator(x), torch.empty_like(x)
            comm.collective.recv(buf, (v + mask + root) % p, tag)
            ops.combine(acc, buf, op, out=acc)
        mask <<= 1
    return x if acc is None else ops.round_into(x, acc)


def gather_linear(comm, x: torch.Tensor, out: torch.Tensor | None, root: int, tag: int):
    """Every rank sends ``x`` to ``root``, which receives them all at once into ``out[k]``.

    Cost: (p-1) alpha + (p-1) n beta at the root (its link is the bottleneck whatever the
    tree, so a linear gather costs only latency). Bytes sent: n by every rank but the root.
    """
    if comm.rank != root:
        comm.collective.send(x, root, tag)
        return None
    out[root].copy_(x)
    reqs = [comm.collective.irecv(out[k], k, tag) for k in range(comm.world_size) if k != root]
    for req in reqs:
        req.wait()
    return out


def scatter_linear(comm, pieces: torch.Tensor | None, out: torch.Tensor, root: int, tag: int):
    """``root`` sends ``pieces[k]`` to rank k, which receives it into ``out``.

    Cost: (p-1) alpha + (p-1) n beta at the root. Bytes sent: (p-1) n by the root.
    """
    if comm.rank != root:
        comm.collective.recv(out, root, tag)
        return out
    reqs = [comm.collective.isend(pieces[k], k, tag) for k in range(comm.world_size) if k != root]
    out.copy_(pieces[root])
    for req in reqs:
        req.wait()
    return out


def all_to_all_pairwise(comm, x: torch.Tensor, out: torch.Tensor, tag: int) -> torch.Tensor:
    """Row j of ``x`` goes to rank j; row i of ``out`` comes from rank i.

    Step s pairs rank r with r + s (send) and r - s (receive), so each step is one
    ``sendrecv`` and no rank is hit by everyone at once. Cost: (p-1) (alpha + n beta), n
    the bytes of one row. Bytes sent: (p-1) n.
    """
    p, r = comm.world_size, comm.rank
    out[r].copy_(x[r])
    for s in range(1, p):
        dst, src = (r + s) % p, (r - s) % p
        comm.collective.sendrecv(x[dst], dst, out[src], src, tag)
    return out
