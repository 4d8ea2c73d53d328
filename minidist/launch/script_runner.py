"""``minidist run -n N script.py args``: start N copies of a script as the ranks of one world.

Like ``torchrun --nproc-per-node N`` or ``horovodrun -np N``: each copy finds its place
through the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...) and calls ``md.init()``.
The launcher owns what the ranks meet through (the shared segment, or a TCPStore on a port
the OS picks), stops every rank as soon as one fails, and exits with that rank's code.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time

from .loopback import LOOPBACK, host_loopback_store, pin_gloo_to_loopback
from .runtime import check_timeout
from .watch import signals_held


class _Stopped(Exception):
    """The runner got SIGTERM or SIGHUP: stop the ranks, then exit."""


def run(nprocs: int, command: list[str], backend: str = "local", device: str = "cpu",
        timeout: float | None = None) -> int:
    """Run ``command`` (``[script, args...]`` or ``["-m", module, args...]``) on N ranks;
    return the failing rank's exit code, or 0 when every rank succeeded."""
    base = _environment(nprocs, backend, device, timeout)
    procs: list[subprocess.Popen] = []
    seg = store = None
    old = _catch_stop_signals()
    try:
        with signals_held():
            seg, store = _meeting_place(backend, nprocs, base)
        for rank in range(nprocs):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            with signals_held():
                procs.append(subprocess.Popen([sys.executable, *command], env=env,
                                              preexec_fn=functools.partial(_die_with_parent,
                                                                           os.getpid())))
        return _supervise(procs, seg)
    except KeyboardInterrupt:
        print("minidist run: interrupted; stopping all ranks", file=sys.stderr)
        return 130
    except _Stopped as e:
        print(f"minidist run: {e}; stopping all ranks", file=sys.stderr)
        return 128 + e.args[1]
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        with signals_held():  # a signal now is delivered once the ranks are stopped
            _stop(procs)
            if seg is not None:
                seg.unlink()
                seg.close()


def _environment(nprocs: int, backend: str, device: str, timeout: float | None) -> dict:
    """What every rank finds in its environment, apart from its rank."""
    if nprocs < 1:
        raise SystemExit(f"minidist run: -n must be at least 1, got {nprocs}")
    try:
        timeout = check_timeout(timeout)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"minidist run: {e}") from None
    threads = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs)))
    return dict(os.environ, WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                MINIDIST_BACKEND=backend, MINIDIST_DEVICE=device, OMP_NUM_THREADS=threads,
                MINIDIST_TIMEOUT=str(timeout))


def _catch_stop_signals() -> dict:
    """SIGTERM and SIGHUP raise ``_Stopped`` (main thread only), so the ranks are stopped."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _stop_signal) for s in (signal.SIGTERM, signal.SIGHUP)}


def _stop_signal(signum, frame) -> None:
    raise _Stopped(f"stopped by {signal.Signals(signum).name}", signum)


def _meeting_place(backend: str, nprocs: int, env: dict):
    """The shared segment (local backend) and the TCPStore the ranks meet at. The store is
    torch's env:// rendezvous too, as torchrun's agent store is (every rank a client of
    it), so a plain torch script's ``dist.init_process_group(...)`` meets there on either
    backend, ``"minidist"`` included."""
    seg = None
    if backend == "local":
        from ..transports.shm_segment import Segment

        seg = Segment.create(nprocs)
        env["MINIDIST_SHM"] = seg.name
    store = host_store()
    env.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(store.port),
               TORCHELASTIC_USE_AGENT_STORE="True")
    if backend == "torch":
        env["MINIDIST_STORE_PORT"] = str(store.port)
    pin_gloo_to_loopback(env)
    return seg, store


def _supervise(procs: list[subprocess.Popen], seg) -> int:
    """Wait for all ranks; on the first failure report it and return its exit code."""
    returned: list[int] = []  # ranks that exited 0 while others still ran, in order
    while True:
        if seg is not None and seg.name and seg.all_attached():
            seg.unlink()  # every rank has mapped it: the name is no longer needed
            seg.name = None
        codes = [p.poll() for p in procs]
        returned += [r for r, c in enumerate(codes) if c == 0 and r not in returned]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            why = f"signal {-code}" if code < 0 else f"exit code {code}"
            print(f"minidist run: rank {rank} failed ({why}); stopping the other ranks"
                  f"{_early(returned, len(procs))}", file=sys.stderr)
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        stuck = _stuck_at_barrier(seg, returned, codes)
        if stuck:
            print(f"minidist run: {stuck}; stopping the other ranks", file=sys.stderr)
            return 1
        time.sleep(0.02)


def _early(returned: list[int], n: int) -> str:
    if not returned or len(returned) == n:
        return ""
    return (f" (rank {returned[0]} had already exited with code 0 while the others still "
            "ran: if the failure is a lost connection, that early exit is its likely cause)")


def _stuck_at_barrier(seg, returned: list[int], codes: list) -> str:
    """Ranks waiting at a shared-memory barrier that a rank which exited never reached."""
    if seg is None or not returned:
        return ""
    counts = seg.barrier_counts()
    for r in returned:
        waiting = [k for k, c in enumerate(codes) if c is None and counts[k] > counts[r]]
        if waiting:
            return (f"rank {r} exited (code 0) while rank(s) {', '.join(map(str, waiting))} "
                    f"waited for it in a collective it never reached")
    return ""


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def host_store():
    """A TCPStore on loopback, on a port the OS picks, so concurrent launches never collide
    on a port. (The ranks are started with fork+exec, so its server thread cannot hurt
    them.)"""
    import datetime

    return host_loopback_store(None, datetime.timedelta(seconds=60))


def _die_with_parent(runner: int) -> None:
    """In each rank, before exec: die with the runner, even if it died before this line."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != runner:
            os._exit(1)
