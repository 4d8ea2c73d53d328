"""The parameter server's own error: a worker left a synchronous step unfinished."""

from __future__ import annotations

from ...errors import MinidistError


class WorkerLeftError(MinidistError):
    """In ``mode="sync"`` with ``on_worker_exit="error"``, a worker closed or died while the
    others still needed its gradient for a step. Carries ``worker`` (its rank), ``reason``
    (``"closed"`` or ``"died"``) and ``step`` (the step it never pushed)."""

    def __init__(self, server: int, worker: int, reason: str, step: int):
        self.server, self.worker, self.reason, self.step = server, worker, reason, step
        how = ("called close()" if reason == "closed"
               else "returned without calling close() (it died)")
        super().__init__(
            f"rank {server} (parameter server, mode='sync'): worker rank {worker} {how} after "
            f"{step} steps, but the other workers went on to step {step + 1}, which needs its "
            "gradient. Make every worker run the same number of steps, or pass "
            "on_worker_exit='continue' to average over the workers that remain.")

    def __reduce__(self):
        return (WorkerLeftError, (self.server, self.worker, self.reason, self.step))
