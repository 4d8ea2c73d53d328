"""The three consistency models as small pure functions: when a step is complete (sync), when
a worker may pull (sync, ssp, async), what the update is. ``server.py`` calls them; the
exercise asks a learner to write them.

Clocks count pushes: a worker that has pushed c times is about to compute step c.
"""

from __future__ import annotations

from collections import deque

import torch


def ssp_admits(clock: int, slowest: int, staleness: int) -> bool:
    """Stale synchronous parallel (Ho et al., NIPS 2013): a worker at ``clock`` may go on only
    while it is at most ``staleness`` steps ahead of the slowest active worker."""
    return clock - slowest <= staleness


def may_pull(mode: str, worker: int, clocks: dict[int, int], active: set[int],
             queued: dict[int, deque], staleness: int) -> bool:
    """Whether the server answers ``worker``'s pull now.

    sync: once every push of this worker has been applied (so it gets the average of all
    workers' gradients of its last step); ssp: ``ssp_admits`` against the slowest active
    worker; async: always."""
    if mode == "sync":
        return not queued[worker]
    if mode == "ssp":
        slowest = min((clocks[w] for w in active), default=clocks[worker])
        return ssp_admits(clocks[worker], slowest, staleness)
    return True


def sync_round(queued: dict[int, deque], active: set[int]) -> list[int] | None:
    """The workers whose oldest queued gradient makes up the next sync step, or None while an
    active worker has not pushed yet. Workers that have left take part with what they pushed
    before leaving; once no worker is active, what remains is applied."""
    if any(not queued[w] for w in active):
        return None
    members = sorted(w for w, q in queued.items() if q)
    return members or None


def average(grads: list[torch.Tensor]) -> torch.Tensor:
    """The mean of the workers' gradients, summed in worker order (the same bits every run,
    whatever order they arrived in), into the first one (the server's own receive buffer)."""
    total = grads[0]
    for g in grads[1:]:
        total += g
    return total.div_(len(grads))
