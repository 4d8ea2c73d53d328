"""all_reduce: every rank ends with the reduction of every rank's tensor.

Five algorithms, slowest idea first, each a short function on a flat tensor ``x`` (in place).
Costs in the alpha-beta-gamma model of Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH" (IJHPCA 2005): alpha is the latency of one
message, beta the time per byte on the wire, gamma the time per byte to reduce; n is the
tensor's size in bytes, p the world size, lg the base-2 logarithm. "Bytes sent" is what
``comm.stats.bytes_sent`` shows on each rank, and what ``tests/test_collectives_bytes.py``
asserts.

| algorithm | latency | bandwidth | best for |
| --- | --- | --- | --- |
| naive | 2(p-1) alpha | 2(p-1) n beta | nothing: the baseline |
| tree | 2 lg p alpha | 2 lg p n beta | small messages, any p |
| recursive_doubling | lg p alpha | lg p n beta | small messages (MPICH's short-message pick) |
| ring | 2(p-1) alpha | 2 (p-1)/p n beta | large messages (Baidu, Horovod) |
| halving_doubling | 2 lg p alpha | 2 (p-1)/p n beta | large messages, many ranks (Rabenseifner) |

``auto`` (in ``auto.py``) picks one from measured figures, or a backend's own fast path.
Two more use the node layout of a cluster (``hierarchical.py``): ``hierarchical``
(reduce-scatter in the node, ring across nodes, all-gather in the node) and
``topology_ring`` (the ring in node order).
"""

from __future__ import annotations

import torch

from . import ops
from .rooted import broadcast_tree, reduce_tree
from .tags import TAG, chunk_bounds


def naive(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """Every rank sends its tensor to rank 0, which reduces and sends the result back.

    Cost: 2(p-1) alpha + 2(p-1) n beta + (p-1) n gamma, all of it at rank 0.
    Bytes sent: rank 0 sends (p-1) n, every other rank n.
    """
    p, tag = comm.world_size, TAG["naive"]
    if comm.rank != 0:
        comm.collective.send(x, 0, tag)
        comm.collective.recv(x, 0, tag)
        return x
    acc, buf = ops.accumulator(x), torch.empty_like(x)
    for src in range(1, p):  # in rank order: the same rounding on every run
        comm.collective.recv(buf, src, tag)
        ops.combine(acc, buf, op, out=acc)
    ops.round_into(x, acc)
    for req in [comm.collective.isend(x, dst, tag) for dst in range(1, p)]:
        req.wait()
    return x


def tree(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast from it.

    In round k, ranks whose bit k is set send their partial result to the rank 2^k below and
    drop out; after lg p rounds rank 0 holds the total, and the broadcast retraces the tree.
    Cost: 2 lg p (alpha + n beta) + lg p n gamma.
    Bytes sent: n to its parent (every rank but 0) plus n to each child in the broadcast
    tree: rank 0 sends ceil(lg p) n, all ranks together 2(p-1) n.
    """
    reduce_tree(comm, x, op, root=0, tag=TAG["tree"])
    return broadcast_tree(comm, x, root=0, tag=TAG["tree"])


def ring(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce-scatter then all-gather around the ring 0 -> 1 -> ... -> p-1 -> 0.

    The tensor is cut into p chunks. In p-1 steps every rank passes one chunk to its right
    neighbour and adds the one from its left, so that rank r ends with chunk r fully reduced;
    p-1 more steps pass the finished chunks around (Patarasuk and Yuan 2009; Baidu's
    ring-allreduce; Horovod). Every link carries the same load, whatever p.
    Cost: 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma.
    Bytes sent: 2 (p-1)/p n when p divides the length; exactly, every chunk but its own in
    the reduce-scatter and every chunk but its right neighbour's in the all-gather.
    """
    bounds = chunk_bounds(x.numel(), comm.world_size)
    ring_reduce_scatter(comm, x, bounds, op, TAG["ring"])
    return ring_all_gather(comm, x, bounds, TAG["ring"])


def ring_reduce_scatter(comm, x, bounds, op, tag) -> torch.Tensor:
    """After p-1 steps rank r's chunk r of ``x`` holds the reduction of every rank's chunk r
    (other chunks hold partial results)."""
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    buf = torch.empty(bounds[1] - bounds[0], dtype=x.dtype, device=x.device)
    for s in range(p - 1):
        si, ri = (r - s - 1) % p, (r - s - 2) % p  # the chunk I pass on, the one I add to
        mine = x[bounds[ri]:bounds[ri + 1]]
        got = buf[:mine.numel()]
        comm.collective.sendrecv(x[bounds[si]:bounds[si + 1]], right, got, left, tag)
        ops.combine(mine, got, op, out=mine)
    return x


def ring_all_gather(comm, x, bounds, tag) -> torch.Tensor:
    """Rank r starts with chunk r of ``x`` final; after p-1 steps every rank has them all.
    Each step receives straight into its place in ``x``: no extra copy."""
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        si, ri = (r - s) % p, (r - s - 1) % p
        comm.collective.sendrecv(x[bounds[si]:bounds[si + 1]], right,
                                 x[bounds[ri]:bounds[ri + 1]], left, tag)
    return x


def recursive_doubling(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """In round k every rank swaps its whole partial result with the rank whose number
    differs in bit k, and both combine; after lg p rounds all hold the total.

    Latency-optimal: MPICH's choice for short messages (Thakur et al. 2005). A world size
    that is not a power of two is first folded onto the largest power of two p' below it
    (see :func:`_fold`). Both partners compute lower-rank (op) higher-rank, so they hold the
    same bits after every round.
    Cost: lg p' (alpha + n beta + n gamma), plus 2 alpha + 2 n beta + n gamma to fold.
    Bytes sent: lg p' n; with folding, ranks below 2(p-p') send one n more, and those of
    them that drop out send n in all.
    """
    tag = TAG["recursive_doubling"]
    v, pp = _fold(comm, x, op, tag)
    if v >= 0:
        buf, d = torch.empty_like(x), 1
        while d < pp:
            partner = _unfolded(v ^ d, comm.world_size - pp)
            comm.collective.sendrecv(x, partner, buf, partner, tag)
            lo, hi = (buf, x) if partner < comm.rank else (x, buf)
            ops.combine(lo, hi, op, out=x)
            d <<= 1
    return _unfold(comm, x, pp, tag)


def halving_doubling(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """Rabenseifner's algorithm: reduce-scatter by recursive halving, then all-gather by
    recursive doubling.

    Round k of the halving pairs ranks that differ in bit lg p' - 1 - k; each keeps one half
    of its current range, sends the other half to its partner and adds the partner's copy of
    the half it keeps. After lg p' rounds rank v owns chunk v; the doubling retraces the
    rounds, swapping owned ranges. A world size that is not a power of two is folded first.
    Cost: 2 lg p' alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma (Rabenseifner 2004), plus
    2 alpha + 2 n beta + n gamma to fold.
    Bytes sent: 2 (p'-1)/p' n when p' divides the length; with folding, ranks below
    2(p-p') send one n more, and those that drop out send n in all.
    """
    tag = TAG["halving_doubling"]
    v, pp = _fold(comm, x, op, tag)
    if v < 0:
        return _unfold(comm, x, pp, tag)
    extra, b = comm.world_size - pp, chunk_bounds(x.numel(), pp)
    buf = torch.empty(b[pp // 2], dtype=x.dtype, device=x.device)  # the larger half
    lo, hi, d = 0, pp, pp // 2
    while d >= 1:  # halving: my range of chunks shrinks to [v, v + 1)
        mid, partner = (lo + hi) // 2, _unfolded(v ^ d, extra)
        (klo, khi), (slo, shi) = ((mid, hi), (lo, mid)) if v & d else ((lo, mid), (mid, hi))
        keep, got = x[b[klo]:b[khi]], buf[:b[khi] - b[klo]]
        comm.collective.sendrecv(x[b[slo]:b[shi]], partner, got, partner, tag)
        ops.combine(keep, got, op, out=keep)
        lo, hi, d = klo, khi, d // 2
    d = 1
    while d < pp:  # doubling: swap whole owned ranges, which grow back to [0, p')
        partner = _unfolded(v ^ d, extra)
        olo, ohi = (lo - d, lo) if v & d else (hi, hi + d)
        comm.collective.sendrecv(x[b[lo]:b[hi]], partner, x[b[olo]:b[ohi]], partner, tag)
        lo, hi, d = min(lo, olo), max(hi, ohi), d * 2
    return _unfold(comm, x, pp, tag)


def _fold(comm, x: torch.Tensor, op: str, tag: int) -> tuple[int, int]:
    """Fold p ranks onto p' = 2^floor(lg p) (MPICH's way, Thakur et al. 2005).

    With e = p - p' extra ranks, each even rank below 2e sends its tensor to the odd rank
    above it, which combines it in and stands for both; the even ones sit out until
    :func:`_unfold`. Returns (my rank among the p', or -1 if I sit out; p').
    """
    p, r = comm.world_size, comm.rank
    pp = 1 << (p.bit_length() - 1)
    if r >= 2 * (p - pp):
        return r - (p - pp), pp
    if r % 2 == 0:
        comm.collective.send(x, r + 1, tag)
        return -1, pp
    buf = torch.empty_like(x)
    comm.collective.recv(buf, r - 1, tag)
    ops.combine(buf, x, op, out=x)  # lower rank first, as everywhere
    return r // 2, pp


def _unfold(comm, x: torch.Tensor, pp: int, tag: int) -> torch.Tensor:
    """Give the ranks that sat out the result: odd rank r below 2e sends it to r - 1."""
    r = comm.rank
    if r < 2 * (comm.world_size - pp):
        if r % 2 == 0:
            comm.collective.recv(x, r + 1, tag)
        else:
            comm.collective.send(x, r - 1, tag)
    return x


def _unfolded(v: int, extra: int) -> int:
    """The real rank behind folded rank ``v`` (the inverse of ``_fold``'s numbering)."""
    return 2 * v + 1 if v < extra else v + extra
