"""A test's child as a fresh process, and every process it started ended with it.

``minidist grade`` runs each piece of learner code in a process that holds only the
learner's functions and that test's own inputs: not forked from the grader (whose frames,
case tables, references and result pipes a forked child would inherit, reachable through
``inspect`` or ``gc.get_objects()``), but forked from multiprocessing's fork server, a
process started fresh (``exec``) that has imported the library and nothing of the grader's
state. The function to run and its arguments travel to it pickled by the grader (what the
child sends back is plain JSON, ``isolation.py``). The child's parent is the fork server, so
an answer that kills ``os.getppid()`` kills that server (started again for the next test),
never the grader.

The child leads a session of its own and is a child subreaper (``prctl``'s
``PR_SET_CHILD_SUBREAPER``): a process it starts that double-forks is re-parented to it,
not to init, so :func:`end_tree` finds it by parent chain as well as by session, stops all
of them (no new forks), then kills them.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import time
from multiprocessing import forkserver, spawn

from ...transports.name_guard import is_name_guard

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_PRELOAD = ["minidist.grading.engine.preload"]
_context = None


def context():
    """The fork-server context, its server preloading the library (once per grader)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: sessions only
        pass


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process visible in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            out[int(name)] = (int(fields[1]), int(fields[3]))  # ppid, session
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return out


def members(pid: int) -> set[int]:
    """``pid``'s session and every descendant of ``pid`` (by parent chain)."""
    table = _table()
    found = {p for p, (_, sid) in table.items() if sid == pid}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for p, (pp, _) in table.items():
            if pp == parent and p not in found:
                found.add(p)
                frontier.append(p)
    found.discard(os.getpid())
    return found


def end_tree(pid: int, include_self: bool = True) -> None:
    """Stop, then kill, ``pid`` (if ``include_self``), its session and its descendants,
    sparing shared-memory name guards: each removes its segment's name once the processes
    killed here are gone (``transports/shm_segment.py``); killed, it would leave the name."""
    stopped: set[int] = set()
    for _ in range(20):  # until no new process appears: stopped ones cannot fork
        found = members(pid) | ({pid} if include_self else set())
        doomed = {p for p in found - stopped if not is_name_guard(p)}
        if not doomed:
            break
        for p in doomed:
            _signal(p, signal.SIGSTOP)
        stopped |= doomed
    for p in stopped:
        _signal(p, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    if pid == os.getpid():
        return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start(target, args: tuple):
    """``target(*args)`` in a fresh child (a ``multiprocessing`` process of the fork
    server); the process, started. A server an earlier answer killed is replaced."""
    for attempt in range(3):
        proc = context().Process(target=target, args=args, daemon=False)
        try:
            _start_without_main(proc)
            return proc
        except (EOFError, ConnectionError, OSError):
            if attempt == 2:
                raise
            _replace_server()
    raise AssertionError("unreachable")  # pragma: no cover


def _nothing() -> None:  # pragma: no cover - runs in the child
    pass


def warm() -> None:
    """Start the fork server now if it is not running (it preloads the library: seconds),
    and wait until it serves, so that no test's time limit pays for it."""
    context()
    server = forkserver._forkserver
    before = server._forkserver_pid
    server.ensure_running()  # collects a server an answer killed, and starts a new one
    if server._forkserver_pid != before:
        start(_nothing, ()).join(120)


def _start_without_main(proc) -> None:
    original = spawn.get_preparation_data

    def without_main(name):
        # the child must not re-run the grader's __main__ (pytest, the CLI, a script): it
        # gets the library and ``target``'s own module, nothing else of the grader's
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        proc.start()
    finally:
        spawn.get_preparation_data = original


def _replace_server() -> None:
    """The fork server died (an answer killed its parent, which is the server): collect it,
    so that the next start launches a new one."""
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        _signal(pid, signal.SIGKILL)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        try:
            stop()
        except (OSError, ChildProcessError):
            server._forkserver_pid = server._forkserver_address = None


def reap(proc) -> None:
    """End the child and everything it started; collect its exit status."""
    end_tree(proc.pid)
    deadline = time.monotonic() + 5.0
    while proc.is_alive() and time.monotonic() < deadline:
        proc.join(0.05)


def service_pids() -> set[int]:
    """The fork server and multiprocessing's resource tracker, if started: processes this
    module keeps for the grader's whole run (a test's leak check leaves them be)."""
    from multiprocessing import resource_tracker

    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    return {p for p in pids if p is not None}
