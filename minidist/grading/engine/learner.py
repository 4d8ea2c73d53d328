"""The learner's functions, as a stored test reaches them: only in child processes.

A check (``exercises/*/checks.py``) runs in the grader's process and never calls the learner's code
itself. It asks a :class:`Learner` to ``call`` a grader function on the learner's namespace
in a child process, or to ``run_ranks``: ``md.launch`` ranks from a child, each running the
learner's function case after case on a hardened communicator (``sandbox.guard``). What comes
back is plain data (``isolation.py``), judged in the grader's process against its own oracle.

Where the namespace comes from is the only difference between the grader and a notebook's
test cell: the grader loads the notebook's code from the file into each child
(``program.Program.load``); a test cell hands over the kernel's objects, which the forked
child inherits.
"""

from __future__ import annotations

import copy
import os
import time
from multiprocessing.sharedctypes import RawArray

from ...launch import launch
from .feedback import Mistake, describe_remote, with_case
from .harness import deadlock_text, rank_entry, stuck_text
from .isolation import ChildTimeout, RemoteError, error_to_plain, run_in_child, to_plain
from .sandbox import COLLECTIVES, SENDRECV, close_library_sources, forbid, seal_grading

# Seconds a blocking call may wait before it counts as a deadlock: long enough for a loaded
# 2-core machine, short enough that a deadlock is reported quickly.
COMM_TIMEOUT = 10.0
MAX_RANKS = 16


class ProgramError(Exception):
    """The learner's code could not be loaded, or does not define what the test needs."""


class Learner:
    """The learner's ``needs`` (function names), loaded by ``load()`` in each child.

    ``limit`` is the time one test may take in all; ``start()`` starts its clock.
    """

    def __init__(self, needs, load, limit: float = 60.0, quiet: bool = True,
                 quick: bool = True, rules=(), fresh: bool = False):
        self.needs, self._load, self.rules = tuple(needs), load, tuple(rules)
        self.limit, self.quiet, self.quick = limit, quiet, quick
        self.fresh = fresh  # the grader: children are fresh processes (``fresh.py``)
        # read here, in the grader, and carried to the child: a fresh child imports this
        # module anew, so only the value travelling with the learner reaches it
        self.comm_timeout = COMM_TIMEOUT
        self._deadline = time.monotonic() + limit

    def start(self) -> None:
        self._deadline = time.monotonic() + self.limit

    def call(self, body, *args, name: str = "", case: str = ""):
        """``body(namespace, *args)`` in a child, under the test's rules; its (plain)
        result."""
        try:
            return self._run(_call_child, (self, body, args))
        except ChildTimeout:
            raise Mistake(with_case(case, f"{name} did not return within {self.limit:g} s: "
                                      "is there an infinite loop?")) from None
        except RemoteError as e:
            raise Mistake(describe_remote(e, name, case)) from None

    def call_each(self, name: str, calls: list[tuple], labels=None) -> list:
        """The learner's ``name`` called with each argument tuple, in one child; the
        results. The first call that raises becomes a ``Mistake`` naming its case."""
        labels = labels or [""] * len(calls)
        out = self.call(each_call, name, calls, name=name)
        for (kind, value), label in zip(out, labels):
            if kind == "error":
                raise Mistake(describe_remote(RemoteError(**value), name, label))
        return [value for _, value in out]

    def run_ranks(self, case_fn, world_size: int, cases: list, name: str = "",
                  labels: list[str] | None = None) -> list[list[dict]]:
        """Run ``case_fn(comm, namespace, *case)`` for every case on ``world_size`` ranks;
        return ``[rank][case] -> {"value", "traffic"}``. A deadlock, a rank that raised or a
        run past the time limit becomes a ``Mistake`` that says which case and which ranks."""
        labels = labels or [f"world_size={world_size}"] * len(cases)
        progress = RawArray("i", 2 * MAX_RANKS)
        try:
            ranks = self._run(_ranks_child, (self, case_fn, world_size, cases, progress))
        except ChildTimeout:
            raise Mistake(stuck_text(name, self.limit, progress, world_size, labels)) from None
        except RemoteError as e:
            case = progress[2 * e.rank] if e.rank is not None else None
            raise Mistake(describe_remote(e, name, labels[case] if case is not None and
                                          0 <= case < len(labels) else "")) from None
        blocked = {r: out["blocked"] for r, out in enumerate(ranks) if out.get("blocked")}
        if blocked:
            raise Mistake(deadlock_text(name, blocked, ranks, labels))
        for rank, out in enumerate(ranks):
            for label, result in zip(labels, out["results"]):
                _check_channel(result["traffic"], rank, label, self.rules)
        return [out["results"] for out in ranks]

    def each_world(self, case_fn, name: str, worlds: dict, label, rewrite=None):
        """``run_ranks`` for each world size of ``worlds`` (world size -> its cases), then
        case by case ``(world_size, case, label, results)``, ``results[rank]`` that rank's
        ``{"value", "traffic"}``: a world's cases are judged before the next world runs.
        ``label(world_size, *case)`` words a case for feedback; ``rewrite(text, world_size,
        cases, labels)``, if given, rewords a ``Mistake`` the run itself raised."""
        for p, cases in worlds.items():
            cases = [tuple(c) for c in cases]
            labels = [label(p, *c) for c in cases]
            try:
                ranks = self.run_ranks(case_fn, p, cases, name, labels)
            except Mistake as e:
                if rewrite is None:
                    raise
                raise Mistake(rewrite(str(e), p, cases, labels)) from None
            for k, (case, text) in enumerate(zip(cases, labels)):
                yield p, case, text, [ranks[r][k] for r in range(p)]

    def _run(self, fn, args):
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise ChildTimeout("no time left")
        return run_in_child(fn, args, limit=left, quiet=self.quiet, fresh=self.fresh)

    def namespace(self) -> dict:
        """In the child: apply the rules, then load the learner's code."""
        if self.quick:
            os.environ["MINIDIST_QUICK"] = "1"
        forbid(self.rules)
        seal_grading()
        if self.fresh:
            close_library_sources()
        try:
            namespace = self._load()
        except Exception as e:
            raise ProgramError(f"{type(e).__name__}: {e}") from e
        missing = [n for n in self.needs if not callable(namespace.get(n))]
        if missing:
            raise ProgramError(f"`{missing[0]}` is not defined: write it (with that name) in "
                               "its cell")
        return namespace


def _call_child(learner: Learner, body, args):
    return to_plain(body(learner.namespace(), *args))


def each_call(namespace, name, calls) -> list:
    """In the child: the learner's ``name`` called with each argument tuple, each result as
    ("ok", value) or ("error", the exception as plain data), up to the first error."""
    fn, out = namespace[name], []
    for args in calls:
        try:
            out.append(("ok", fn(*copy.deepcopy(args))))
        except Exception as e:
            out.append(("error", error_to_plain(e)))
            break
    return out


def _ranks_child(learner: Learner, case_fn, world_size, cases, progress):
    namespace = learner.namespace()
    results = launch(rank_entry, world_size, timeout=learner.comm_timeout,
                     args=(case_fn, namespace, learner.rules, list(cases), progress))
    return list(results)  # each rank's dict holds plain data only (``rank_entry``)


def _check_channel(traffic: dict, rank: int, label: str, rules) -> None:
    """Whatever a test checks about bytes, it checks the learner's own messages: where the
    library's collectives are out of reach, every byte counted went through the user's
    point-to-point calls, and comm.stats says so."""
    where = f"with {label}: rank {rank}"
    if not traffic.get("eager_ok"):
        raise Mistake(f"{where} changed comm.eager_limit; the grader runs with "
                      "eager_limit = 0, as a cluster does for large messages")
    if SENDRECV in rules and traffic.get("sendrecv"):
        raise Mistake(f"{where} called comm.sendrecv, which this exercise does not allow: "
                      "order comm.send and comm.recv yourself (or post comm.irecv first)")
    if COLLECTIVES not in rules:
        return
    if traffic.get("hidden"):
        raise Mistake(f"{where} sent {traffic['hidden']} bytes on the library's control "
                      "channel (comm.control), which is not for payload: use comm.send, "
                      "comm.recv, comm.isend and comm.irecv")
    if not traffic.get("stats_ok"):
        raise Mistake(f"{where}: comm.stats does not match the messages this rank sent "
                      "(was it edited or reset?); the test counts the messages themselves")
