"""``md.elastic.launch``: the elastic agent (torchrun's ``--nnodes=MIN:MAX --max-restarts``).

The agent runs in the caller. It launches the job with ``md.launch`` and watches it; the
job's ranks resume from the last commit each time (``loop.run``). Three endings:

* every rank returned: done, the results come back (``ElasticResults``, a list by rank);
* every rank raised ``HostsUpdatedInterrupt`` at the same commit (the rendezvous offered
  another number of slots): relaunch at that size, from that commit (a join or a
  planned shrink; not counted against ``max_restarts``, as in torchrun);
* a rank failed (killed, crashed, or a ``CommTimeout`` from a rank stuck waiting):
  ``md.launch`` stops the others at once and names the rank; the agent drops that slot
  (Horovod blacklists the failed host) and relaunches the survivors' count from the last
  commit, or raises ``NotEnoughRanksError`` if fewer than ``min_ranks`` are left, or
  ``ElasticError`` after ``max_restarts`` failures.

Each relaunch costs the start of fresh processes plus the restore (``costmodel.elastic``); the bench
``minidist bench elastic`` measures both.

Before the first launch the agent checks what no relaunch can fix, since a rank that fails
on it fails again at every size, until ``NotEnoughRanksError`` says nothing useful: the
commit directory (``CommitStore.prepare``) and the last commit (damaged or planted: a
``CommitError`` naming the file). A missing ``commit_dir`` is created (``mkdir -p``, mode
0700), as torch's distributed checkpoint (``FileSystemWriter``) and Lightning's
``ModelCheckpoint`` do: a learner names a checkpoint directory to be made, and the first
run of a job has none yet; a path that is a file is an error (``NotADirectoryError``),
since writing commits beside it or replacing it would be a guess. The agent owns the
directory during a run: before each launch, when no rank is alive, it removes the
temporaries that a write cut short left there (``.commit-*.tmp``, only those), which a
second job writing in the same directory would lose: one job per commit directory.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from ...checks import integer
from ...errors import MinidistError, WorkerError
from ...launch import launch as md_launch
from .loop import HostsUpdatedInterrupt
from .rendezvous import Rendezvous
from .state import CommitStore


class ElasticError(MinidistError):
    """The elastic job cannot go on. ``attempts``: what happened so far (a list of ``Attempt``)."""

    def __init__(self, message: str, attempts: list | None = None):
        self.attempts = list(attempts or [])
        super().__init__(message)


class NotEnoughRanksError(ElasticError):
    """Fewer than ``min_ranks`` ranks are left. ``left``: the ranks (of the last attempt's
    world) still alive, or the slots offered."""

    def __init__(self, min_ranks: int, left: list[int], why: str, attempts=None):
        self.min_ranks, self.left = min_ranks, left
        who = ", ".join(map(str, left)) or "none"
        super().__init__(f"elastic job stopped: it needs at least min_ranks={min_ranks} ranks, "
                         f"but only {len(left)} {'is' if len(left) == 1 else 'are'} left "
                         f"(ranks {who} of the last world); {why}", attempts)


@dataclass(frozen=True)
class Attempt:
    """One launch: its ``world_size``, the committed step it started from and the one
    committed when it ended, how it ended (``"done"``, ``"resized"``, ``"failed"``), the
    failed rank and its error, and the seconds the launch took."""

    attempt: int
    world_size: int
    start_step: int | None
    end_step: int | None
    outcome: str
    failed_rank: int | None = None
    error: str = ""
    seconds: float = 0.0


class ElasticResults(list):
    """The last attempt's results by rank; ``attempts``: every ``Attempt``, in order."""

    attempts: list[Attempt]


@dataclass(frozen=True)
class _Resized:
    world_size: int
    step: int


def _attempt(comm, fn, rdzv, args, kwargs):
    """One rank of one attempt: the user's function, or the membership-change marker."""
    try:
        return fn(comm, rdzv, *args, **kwargs)
    except HostsUpdatedInterrupt as e:
        return _Resized(e.world_size, e.step)


def launch(fn: Callable, world_size: int, *, min_ranks: int = 1, max_ranks: int | None = None,
           max_restarts: int = 3, discover: Callable[[int], int] | None = None,
           args: tuple = (), kwargs: dict | None = None, commit_dir: str | None = None,
           **launch_options) -> ElasticResults:
    """Run ``fn(comm, rdzv, *args, **kwargs)`` elastically on ``world_size`` ranks.

    ``min_ranks``/``max_ranks``: the sizes the job may run at (torchrun's ``MIN:MAX``);
    ``max_restarts``: failures tolerated; ``discover(step) -> slots``: how many slots the
    cluster offers at a commit (joins and planned shrinks); ``commit_dir``: where commits
    live (created if missing; a temporary directory, removed at the end, by default; give
    one only you can write: see ``commit_store.py``); ``launch_options``: passed to
    ``md.launch`` (``timeout``, ``backend``, ``network``...)."""
    max_ranks = world_size if max_ranks is None else max_ranks
    _check_sizes(world_size, min_ranks, max_ranks, max_restarts)
    with _directory(commit_dir) as directory:
        store, attempts = CommitStore(directory), []
        store.prepare()
        n, restarts = world_size, 0
        while True:
            store.remove_stale()
            rdzv = Rendezvous(store.quiet(), len(attempts), restarts, n, min_ranks, max_ranks,
                              discover)
            start, t0 = store.step(), time.perf_counter()
            try:
                results = md_launch(_attempt, n, args=(fn, rdzv, tuple(args), kwargs or {}),
                                    **launch_options)
            except WorkerError as e:
                attempts.append(Attempt(len(attempts), n, start, store.step(), "failed",
                                        e.rank, e.message, time.perf_counter() - t0))
                restarts += 1
                n = _after_failure(e, n, min_ranks, restarts, max_restarts, attempts)
                continue
            n_next = _resized_to(results, attempts)
            outcome = "done" if n_next is None else "resized"
            attempts.append(Attempt(len(attempts), n, start, store.step(), outcome,
                                    seconds=time.perf_counter() - t0))
            if n_next is None:
                out = ElasticResults(results)
                out.attempts = attempts
                return out
            if n_next < min_ranks:
                raise NotEnoughRanksError(min_ranks, list(range(n_next)), f"discover offered "
                                          f"{n_next} slots at step {store.step()}", attempts)
            n = n_next


def _after_failure(e: WorkerError, n: int, min_ranks: int, restarts: int, max_restarts: int,
                   attempts: list[Attempt]) -> int:
    """The next world size after rank ``e.rank`` of ``n`` failed."""
    left = [r for r in range(n) if r != e.rank]
    if len(left) < min_ranks:
        raise NotEnoughRanksError(min_ranks, left, f"rank {e.rank} failed: {e.message}",
                                  attempts) from e
    if restarts > max_restarts:
        raise ElasticError(f"elastic job gave up after max_restarts={max_restarts} failures; "
                           f"the last: rank {e.rank} of {n}: {e.message}", attempts) from e
    return len(left)


def _resized_to(results: list, attempts: list[Attempt]) -> int | None:
    """The new size if every rank stopped at a membership change, None if all finished."""
    marks = [r for r in results if isinstance(r, _Resized)]
    if not marks:
        return None
    if len(marks) != len(results) or len({(m.world_size, m.step) for m in marks}) != 1:
        raise ElasticError(f"the ranks disagree on the membership change: {results!r}",
                           attempts)
    return marks[0].world_size


@contextmanager
def _directory(commit_dir: str | None):
    if commit_dir is not None:
        yield commit_dir
        return
    with tempfile.TemporaryDirectory(prefix="minidist-elastic-") as d:
        yield d


def _check_sizes(world_size, min_ranks, max_ranks, max_restarts) -> None:
    for name, value in (("world_size", world_size), ("min_ranks", min_ranks),
                        ("max_ranks", max_ranks)):
        integer(value, name)
    integer(max_restarts, "max_restarts", low=0)
    if not min_ranks <= world_size <= max_ranks:
        raise ValueError(f"world_size={world_size} must lie between min_ranks={min_ranks} and "
                         f"max_ranks={max_ranks}")
