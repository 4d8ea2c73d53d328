"""``Rendezvous``: what the ranks of one attempt share, handed to each by the agent.

In torchrun the rendezvous is where the agents of the nodes meet (a c10d store) and agree
on the membership, the world size and the restart count, which it passes to the workers as
``WORLD_SIZE`` and ``TORCHELASTIC_RESTART_COUNT``. Here the agent is one process (the
caller of ``md.elastic.launch``) that decides alone, so the rendezvous is a plain record it
gives every rank of an attempt: the commit store, the counters, the size limits, and the
discovery function that says how many slots the cluster offers now (Horovod's
``--host-discovery-script``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .state import CommitStore


@dataclass(frozen=True)
class Rendezvous:
    """One attempt's shared facts. ``store``: where commits live; ``attempt``: 0 for the
    first launch, +1 per relaunch; ``restart_count``: relaunches caused by failures (what
    ``max_restarts`` bounds); ``world_size``, ``min_ranks``, ``max_ranks``; ``discover``:
    ``discover(step) -> slots`` (None: the current world size, i.e. no joins)."""

    store: CommitStore
    attempt: int
    restart_count: int
    world_size: int
    min_ranks: int
    max_ranks: int
    discover: Callable[[int], int] | None = None

    def offered(self, step: int) -> int:
        """Slots the cluster offers at ``step`` (called on rank 0 at each commit)."""
        if self.discover is None:
            return self.world_size
        n = self.discover(step)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"discover({step}) must return a number of slots (an int >= 0), "
                             f"got {n!r}")
        return min(n, self.max_ranks)
