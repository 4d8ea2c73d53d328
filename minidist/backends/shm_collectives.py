"""The local backend's own all_reduce: reduce in shared memory instead of passing messages.

All ranks of the local backend map one segment (``shm.py``), so within a node they can skip
messages altogether, as MPI libraries do (Open MPI's ``coll/sm``, MPICH's shared-memory
collectives). The segment's scratch area holds one counter per rank, one slot per rank and
one result slot. The tensor goes through in slot-sized pieces; for each piece, with rank r
in charge of element range r (of p nearly equal ranges):

    1. rank r copies its piece into its slot, all but range r (nobody else reads that);
                                                            barrier
    2. rank r reduces range r: its own tensor and the other p-1 slots, in rank order, one
       float32 accumulator for 16-bit floats (``collectives/ops.py``), into range r of
       the result slot and of its own tensor;               barrier
    3. rank r copies the other ranges of the result slot into its tensor.

Each element is reduced by exactly one rank, so every rank gets the same bits. A rank writes
its slot only after the barrier that ends every reader's step 2 of the previous piece, and
the result slot is written only after the next step-1 barrier, which every rank reaches after
its step 3: two barriers per piece are enough.

Pieces are small (``PIECE``) so that what one core writes is still in the shared cache
when another reads it; the barriers are counters in shared memory, not messages (a few
hundred nanoseconds when every rank has a core, a futex sleep otherwise).

Cost per rank: copy (p-1)/p n in, read n and write 2n/p to reduce, copy (p-1)/p n out, two
barriers per piece; no messages at all, so ``comm.stats`` does not count these bytes. Used by
``auto`` on the world communicator only: every world rank owns its slot, whereas ranks of two
split-off communicators could run at the same time and would share the slots.
"""

from __future__ import annotations

import time

import torch

from ..collectives import ops
from ..collectives.common import chunk_bounds
from ..errors import CommTimeout
from .shm import LINE

PIECE = 256 * 1024  # bytes per slot: measured best on a 2-core EPYC (L2 2 MiB per core)
_SLOTS_AT = 4096  # counters first, slots after


def available(comm, x: torch.Tensor) -> bool:
    """True when ``comm`` is a local-backend world communicator with scratch, ``x`` on CPU."""
    tr = comm._transport
    return (tr.name == "local" and x.device.type == "cpu" and comm.world_size > 1
            and tr.seg.scratch_bytes >= _SLOTS_AT + (comm.world_size + 1) * 64
            and comm._group == tuple(range(tr.world_size)))


def all_reduce_shm(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce ``x`` (flat, CPU) over all ranks in place, through the segment's scratch area."""
    seg, p, r = comm._transport.seg, comm.world_size, comm.rank
    slots = _slots(seg, p, x.dtype)  # rows 0..p-1: one per rank; row p: the result
    barrier = _Barrier(comm)
    step = slots.shape[1]
    for start in range(0, x.numel(), step):
        piece = x[start:start + step]
        b = chunk_bounds(piece.numel(), p)
        lo, hi = b[r], b[r + 1]
        slots[r, :lo].copy_(piece[:lo])
        slots[r, hi:b[p]].copy_(piece[hi:])
        barrier.wait()
        parts = [piece[lo:hi] if k == r else slots[k, lo:hi] for k in range(p)]
        ops.reduce_all(parts, op, slots[p, lo:hi])
        piece[lo:hi].copy_(slots[p, lo:hi])
        barrier.wait()
        piece[:lo].copy_(slots[p, :lo])
        piece[hi:].copy_(slots[p, hi:b[p]])
    return x


def _slots(seg, p: int, dtype: torch.dtype) -> torch.Tensor:
    slot_bytes = min(PIECE, (seg.scratch_bytes - _SLOTS_AT) // (p + 1) // 64 * 64)
    raw = torch.frombuffer(seg.mm, dtype=torch.uint8, offset=seg.scratch_offset + _SLOTS_AT,
                           count=(p + 1) * slot_bytes)
    return raw.view(p + 1, slot_bytes).view(dtype)


class _Barrier:
    """Counter barrier in the scratch area: barrier number g is passed when every rank's
    counter reaches g. The counters live in shared memory and only grow, so calls need no
    set-up. Waiting spins as the transport does, then sleeps on the rank's doorbell."""

    def __init__(self, comm):
        tr = comm._transport
        self.seg, self.rank, self.timeout = tr.seg, comm.rank, comm.timeout
        self.words = [tr.seg.word64(tr.seg.scratch_offset + k * LINE)
                      for k in range(comm.world_size)]
        self.bells = [tr.seg.bell(k) for k in range(comm.world_size) if k != comm.rank]
        self.my_bell, self.spin = tr.my_bell, tr.spin

    def wait(self) -> None:
        g = self.words[self.rank].value + 1
        self.words[self.rank].value = g
        for bell in self.bells:
            self.seg.ring_bell(bell)
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
                raise CommTimeout("all_reduce (shared-memory barrier)", None, None,
                                  self.timeout, self.rank)
            self.seg.sleep_on_bell(self.my_bell, seen, min(0.05, deadline - now))
