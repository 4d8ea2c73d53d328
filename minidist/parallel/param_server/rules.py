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


class RunningMean:
    """``average`` as the pushes arrive: each worker's gradient is added, in worker order,
    as soon as every worker before it has pushed (or has left with nothing queued), so
    that when the last one lands only its own addition and the division remain (the server
    spends the wait for the slowest worker adding up the others). The same additions in the
    same order as ``average``, into the same buffer: the same bits."""

    def __init__(self) -> None:
        self.members: list[int] = []
        self.total: torch.Tensor | None = None

    def catch_up(self, heads: dict[int, torch.Tensor], active: set[int]) -> None:
        """``heads``: each worker's oldest queued gradient (the step being formed)."""
        for w in sorted(set(heads) | active):
            if w in self.members:
                continue
            if w not in heads:
                if w in active:
                    return  # not pushed yet: the ones after it wait
                continue
            self.total = heads[w] if self.total is None else self.total.add_(heads[w])
            self.members.append(w)

    def finish(self, heads: dict[int, torch.Tensor], members: list[int]) -> torch.Tensor:
        """The mean over ``members`` (``sync_round``'s), starting over for the next step."""
        self.catch_up(heads, set())
        if self.members != members:
            raise RuntimeError(f"sync step summed workers {self.members}, but its members "
                               f"are {members}")
        total, self.members, self.total = self.total.div_(len(members)), [], None
        return total
