"""The local backend's own all_reduce: reduce in shared memory instead of passing messages.

All ranks of the local backend map one segment (``shm.py``), so within a node they can skip
messages altogether, as MPI libraries do (Open MPI's ``coll/sm``, MPICH's shared-memory
collectives). The segment's scratch area holds one counter per rank, one slot per rank and
one result slot. The tensor goes through in slot-sized pieces; for each piece, with rank r
in charge of element range r, [m r / p, m (r + 1) / p) of the piece's m elements:

    1. rank r copies its piece into its slot, all but range r (nobody else reads that);
                                                            barrier
    2. rank r reduces range r: its own tensor and the other p-1 slots, in rank order, one
       float32 accumulator for 16-bit floats (``collectives/ops.py``), into range r of
       the result slot (dividing it by p for ``avg``) and of its own tensor;   barrier
    3. rank r copies the other ranges of the result slot into its tensor.

Each element is reduced by exactly one rank, so every rank gets the same bits. A rank writes
its slot only after the barrier that ends every reader's step 2 of the previous piece, and
the result slot is written only after the next step-1 barrier, which every rank reaches after
its step 3: two barriers per piece are enough.

Pieces are large (``PIECE``, 4 MiB) because each one costs about 20 Python-level torch
calls and two barriers: with 64 KiB pieces a 16 MiB all_reduce took 5 times as long here.
The barriers are counters in shared memory, not messages: a few microseconds when every
rank has a core, a futex sleep otherwise.

The tensor may also be a list of tensors, reduced as their concatenation (DDP's buckets of
gradients, reduced where they lie).

Cost per rank: copy (p-1)/p n in, read n and write 2n/p to reduce, copy (p-1)/p n out, two
barriers per piece; no messages at all. ``comm.stats`` counts the bytes as the messages they
replace (``_count``: 2(p-1)/p n per rank, as the ring), so byte checks hold on this path too.
Used by
``auto`` on the world communicator only: every world rank owns its slot, whereas ranks of two
split-off communicators could run at the same time and would share the slots.
"""

from __future__ import annotations

import bisect
import time

import torch

from ..errors import CommTimeout
from ..transports.shm_segment import LINE
from . import ops

PIECE = 4 << 20  # bytes per slot; smaller pieces pay more per-piece Python overhead
_SLOTS_AT = 4096  # counters first, slots after
_SPIN = 50e-6  # seconds a barrier spins before it sleeps


def world_ok(comm) -> bool:
    """True when ``comm`` is a world communicator whose transport offers a shared scratch
    area (the local transport's segment) large enough for its ranks."""
    if comm.world_size < 2 or not comm.is_world:
        return False
    scratch = comm.capability("shared_scratch")
    return scratch is not None and scratch.nbytes >= _SLOTS_AT + (comm.world_size + 1) * 64


def available(comm, x: torch.Tensor) -> bool:
    """True when :func:`all_reduce_shm` can reduce ``x`` on ``comm``."""
    return x.device.type == "cpu" and world_ok(comm)


def same_everywhere(comm, h: int, what: str = "agreement check") -> bool:
    """One barrier that also compares a number across ranks: True on every rank if every
    rank passed the same ``h``, False on every rank otherwise. The collectives' agreement
    check (``collectives/agreement.py``) on a world communicator of this backend.

    Each rank writes ``h`` next to its counter before arriving; there are two such words,
    used in turns, because a fast rank may write the next check's ``h`` while a slow one
    is still reading this one's (it cannot get two checks ahead: that needs a barrier the
    slow rank has not reached).
    """
    barrier, scratch = _Barrier(comm, what), comm.capability("shared_scratch")
    turn = 8 * (1 + (barrier.words[comm.rank].value + 1) % 2)
    hashes = [scratch.word64(k * LINE + turn) for k in range(comm.world_size)]
    hashes[comm.rank].value = h
    barrier.wait()
    return all(w.value == h for w in hashes)


def all_reduce_shm(comm, xs, op: str):
    """Reduce over all ranks in place, through the segment's scratch area. Like every
    all_reduce algorithm it leaves ``avg`` as a sum: the caller divides (``ops.finish_``).

    ``xs`` is one flat CPU tensor, or a list of flat CPU tensors of one dtype reduced as if
    they were concatenated (``all_reduce_coalesced``: DDP's gradients go through the slots
    straight from ``param.grad``, without being copied into a bucket first and back after).
    """
    p, r = comm.world_size, comm.rank
    flat = _Concat([xs] if isinstance(xs, torch.Tensor) else list(xs))
    slots = _slots(comm.capability("shared_scratch"), p, flat.dtype)  # p: the result
    mine, result, barrier = slots[r], slots[p], _Barrier(comm, "all_reduce")
    step = slots[0].numel()
    for start in range(0, flat.numel, step):
        m = min(step, flat.numel - start)
        lo, hi = m * r // p, m * (r + 1) // p  # my range; nobody else reads it
        flat.gather(start, start + lo, mine)
        flat.gather(start + hi, start + m, mine, at=hi)
        barrier.wait()
        if hi > lo:
            own = flat.range(start + lo, start + hi, mine, at=lo)  # a view, or copied in
            parts = [own if k == r else slots[k][lo:hi] for k in range(p)]
            ops.reduce_all(parts, op, result[lo:hi])
            flat.scatter(start + lo, start + hi, result, at=lo)
        barrier.wait()
        flat.scatter(start, start + lo, result)
        flat.scatter(start + hi, start + m, result, at=hi)
        _count(comm.stats, m, p, r, slots[0].element_size())
    return xs


def _count(stats, m: int, p: int, r: int, size: int) -> None:
    """Count one piece's traffic as the messages it replaces: rank r hands rank k its range
    k of the piece (step 1, read by k) and hands every other rank its reduced range r (step
    3); it gets range r from each other rank and their reduced ranges back. Bytes sent per
    rank: sum over k != r of m_k, plus (p-1) m_r elements, 2(p-1)/p n in all when p divides
    the piece, as for the ring (``costs.py``)."""
    mine = m * (r + 1) // p - m * r // p
    for k in range(p):
        if k != r:
            theirs = m * (k + 1) // p - m * k // p
            stats.on_send(k, (theirs + mine) * size)
            stats.on_recv(k, (mine + theirs) * size)


class _Concat:
    """Several flat tensors seen as one: copy element ranges ``[a, b)`` of the concatenation
    to and from a contiguous slot, one ``copy_`` per tensor the range touches."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = [t for t in tensors if t.numel()]
        self.dtype = tensors[0].dtype
        self.starts = [0]
        for t in self.tensors:
            self.starts.append(self.starts[-1] + t.numel())
        self.numel = self.starts[-1]

    def _pieces(self, a: int, b: int):
        """(tensor, offset in it, offset from a, length) for each tensor [a, b) touches."""
        i = bisect.bisect_right(self.starts, a) - 1
        while a < b:
            t, t0 = self.tensors[i], self.starts[i]
            n = min(b, self.starts[i + 1]) - a
            yield t, a - t0, a, n
            a, i = a + n, i + 1

    def gather(self, a: int, b: int, slot: torch.Tensor, at: int = 0) -> None:
        """slot[at : at + b - a] = concatenation[a:b]"""
        for t, off, pos, n in self._pieces(a, b):
            slot[at + pos - a:at + pos - a + n].copy_(t[off:off + n])

    def scatter(self, a: int, b: int, slot: torch.Tensor, at: int = 0) -> None:
        """concatenation[a:b] = slot[at : at + b - a]"""
        for t, off, pos, n in self._pieces(a, b):
            t[off:off + n].copy_(slot[at + pos - a:at + pos - a + n])

    def range(self, a: int, b: int, slot: torch.Tensor, at: int) -> torch.Tensor:
        """concatenation[a:b] as a view when it lies in one tensor, else gathered into
        ``slot[at:]`` (a part of the slot nobody else reads)."""
        pieces = list(self._pieces(a, b))
        if len(pieces) == 1:
            t, off, _, n = pieces[0]
            return t[off:off + n]
        self.gather(a, b, slot, at)
        return slot[at:at + b - a]


def _slots(scratch, p: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The p + 1 slots of the scratch area as 1-D tensors of ``dtype``."""
    slot_bytes = min(PIECE, (scratch.nbytes - _SLOTS_AT) // (p + 1) // 64 * 64)
    raw = scratch.tensor(_SLOTS_AT, (p + 1) * slot_bytes)
    return list(raw.view(dtype).view(p + 1, -1).unbind(0))


class _Barrier:
    """Counter barrier in the scratch area (one cache line per rank: the counter, then the
    two words of :func:`same_everywhere`): barrier number g is passed when every rank's
    counter reaches g. The counters live in shared memory and only grow, so calls need no
    set-up. Waiting spins as the transport does, then sleeps on the rank's doorbell."""

    def __init__(self, comm, what: str = "collective"):
        scratch = comm.capability("shared_scratch")
        self.scratch, self.rank, self.timeout, self.what = scratch, comm.rank, comm.timeout, what
        self.words = [scratch.word64(k * LINE) for k in range(comm.world_size)]
        self.bells = [scratch.bell(k) for k in range(comm.world_size) if k != comm.rank]
        # spin as the transport does (only when every rank has a core), but briefly: ranks
        # that arrive together meet within microseconds, and a rank that spins while the
        # one it waits for has no core only delays it
        self.my_bell, self.spin = scratch.my_bell, min(scratch.spin, _SPIN)

    def wait(self) -> None:
        g = self.words[self.rank].value + 1
        self.words[self.rank].value = g
        for bell in self.bells:
            self.scratch.ring(bell)
        now = time.perf_counter()
        spin_until, deadline = now + self.spin, now + self.timeout
        while True:
            seen = self.my_bell.value
            if all(w.value >= g for w in self.words):
                return
            now = time.perf_counter()
            if now < spin_until:
                continue
            if now >= deadline:
                raise self._timeout(g)
            self.scratch.sleep(self.my_bell, seen, min(0.05, deadline - now))

    def _timeout(self, g: int) -> CommTimeout:
        """Name the ranks that never arrived (the counters tell); ranks are the world's."""
        late = [k for k, w in enumerate(self.words) if w.value < g]
        came = [k for k, w in enumerate(self.words) if w.value >= g]
        s = "s" if len(late) > 1 else ""
        return CommTimeout(f"{self.what} (shared-memory barrier)", None, None, self.timeout,
                           self.rank, f"Rank{s} {', '.join(map(str, late))} never reached it "
                                      f"(rank{'s' if len(came) > 1 else ''} "
                                      f"{', '.join(map(str, came))} did).")
