"""The Transport protocol: what a Communicator needs from whatever moves its bytes.

A transport moves tensors between *global* ranks (0..world_size-1 of the launch); the
Communicator above it (``comm/communicator.py``) translates local ranks, validates
arguments, counts bytes and keeps the timeline, so a transport stays a handful of
primitives. Messages carry a context id (``ctx``: which communicator and channel) and a tag;
a receive matches the earliest message with the same ctx and tag from its source (or from
any source), and messages between two ranks on one (ctx, tag) arrive in the order sent.

Three transports satisfy it: ``local.LocalTransport`` (shared memory), ``torch_dist.
TorchTransport`` (a torch.distributed process group) and ``emulated.EmulatedTransport``
(the local one with a latency/bandwidth model per link). ``tests/transports`` checks each
against this protocol.

Optional capabilities, asked for by name with ``capability(name)`` (None when absent), let
a collective use a faster path without reaching into a transport's insides:

* ``"shared_scratch"``: a ``SharedScratch`` (``local.py``), memory every rank maps, with
  counters and doorbells: the shared-memory all_reduce (``collectives/shared_memory.py``).
* ``"shared_memory"``: ``SharedBuffer`` (``shm_segment.py``): every rank is on this machine,
  so a block of shared memory one rank makes, the others can map by name: the parameter
  server's shards and gradient slots (``parallel/param_server/shared_shards.py``).
* ``"process_group"``: the ``torch.distributed`` group of the whole world, for
  ``torch.distributed.all_reduce`` itself (``collectives/auto.py``).
* ``"network"``: the emulated ``Network`` (``network.py``), so ``auto`` predicts each
  algorithm's time from the described links rather than from this machine.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class RawRequest(Protocol):
    """What a transport's request reports once done (receives fill in the message's side)."""

    done: bool
    source: int        # the sender's global rank (receives)
    mismatch: bool     # the message's size or dtype differs from the buffer's
    nbytes: int        # the buffer's bytes
    msg_nbytes: int    # the message's bytes
    code: int          # the buffer's dtype code (``comm/tensors.py``)
    msg_code: int      # the message's dtype code


@runtime_checkable
class Transport(Protocol):
    name: str          # "local", "torch", "emulated"
    rank: int          # this process's global rank
    world_size: int
    cuda_native: bool  # True when CUDA tensors travel as they are (NCCL); else staged on host

    def isend(self, t: torch.Tensor, dst: int, ctx: int, tag: int, code: int) -> Any:
        """Start sending the bytes of ``t`` (contiguous); ``t`` stays untouched until done."""

    def irecv(self, t: torch.Tensor, src: int, ctx: int, tag: int, code: int) -> Any:
        """Start receiving into ``t``; ``src`` may be ``ANY_SOURCE`` (-1)."""

    def wait(self, req: Any, timeout: float) -> bool:
        """Make progress until ``req`` is done; False if ``timeout`` seconds pass first."""

    def test(self, req: Any) -> bool:
        """Make some progress; True if ``req`` is done. Never blocks."""

    def capability(self, name: str) -> Any:
        """An optional capability by name (see the module docstring), or None."""

    def close(self) -> None:
        """Finish pending sends and release what the transport holds."""
