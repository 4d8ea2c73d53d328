"""The local transport's shared scratch area as a capability (``comm.capability(
"shared_scratch")``): memory every rank maps, 64-bit words in it, and the ranks' doorbells
to wait on. The shared-memory collectives (``collectives/shared_memory.py``) build on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .local import LocalTransport


class SharedScratch:
    """The segment's scratch area as a capability: memory every rank of the local transport
    maps, 64-bit words in it, and the ranks' doorbells to wait on. Offsets are relative to
    the start of the area."""

    def __init__(self, transport: LocalTransport):
        seg = transport.seg
        self._seg, self.nbytes, self._at = seg, seg.scratch_bytes, seg.scratch_offset
        self.my_bell, self.spin = transport.my_bell, transport.spin

    def word64(self, offset: int):
        return self._seg.word64(self._at + offset)

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the area from ``offset`` as a uint8 tensor sharing its memory."""
        return torch.frombuffer(self._seg.mm, dtype=torch.uint8, offset=self._at + offset,
                                count=nbytes)

    def bell(self, rank: int):
        return self._seg.bell(rank)

    def ring(self, bell) -> None:
        self._seg.ring_bell(bell)

    def sleep(self, bell, seen: int, seconds: float) -> None:
        self._seg.sleep_on_bell(bell, seen, seconds)
