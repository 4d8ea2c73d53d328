"""What ``ParameterServer.report()`` returns: plain dataclasses, picklable, so a function run
by ``md.launch`` can return them to the notebook."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ServerReport:
    """One server's statistics. ``staleness[i]``: how many updates this server applied
    between the pull a push was computed on and the push itself, for every push it applied
    (0 for every push in sync mode). ``bytes_in``/``bytes_out``: payload bytes of gradients
    received and parameters sent (headers excluded, as ``comm.stats`` excludes control
    traffic). ``max_ahead``: the largest ``c - slowest`` a pull was admitted at (ssp: never
    above the bound). ``departed``: worker rank -> ``"closed"`` or ``"died"``;
    ``departed_step``: worker rank -> its last step this server heard (how many of its
    pushes it had received when the worker left; one that died during step k, counting
    from 0, has k). ``departures()`` says both in words."""

    rank: int
    mode: str
    numel: int
    updates: int = 0
    pushes: int = 0
    pulls: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    max_ahead: int = 0
    staleness: list[int] = field(default_factory=list)
    pushes_by_worker: dict[int, int] = field(default_factory=dict)
    departed: dict[int, str] = field(default_factory=dict)
    departed_step: dict[int, int] = field(default_factory=dict)

    def departures(self) -> list[str]:
        """One line per worker that left, in rank order: "worker 3 died after 5 pushes"."""
        return [f"worker {w} {why} after {n} push{'es' if n != 1 else ''}"
                for w, why in sorted(self.departed.items())
                for n in [self.departed_step.get(w, 0)]]

    def staleness_histogram(self) -> dict[int, int]:
        """Staleness -> how many applied pushes had it, in increasing staleness."""
        return dict(sorted(Counter(self.staleness).items()))


@dataclass
class WorkerReport:
    """One worker's statistics: ``steps`` (pushes), ``pulls``, seconds blocked in ``pull``
    (waiting for the servers to admit it and send the parameters) and in ``push``;
    ``staleness``: for each pull after a push, the staleness the servers recorded for this
    worker's latest push (the largest over servers); ``versions``: the version each pull got
    (server 0's count of updates)."""

    rank: int
    mode: str
    steps: int = 0
    pulls: int = 0
    pull_wait_s: float = 0.0
    push_s: float = 0.0
    staleness: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
