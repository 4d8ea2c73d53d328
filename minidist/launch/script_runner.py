"""``minidist run -n N script.py args``: start N copies of a script as the ranks of one world.

Like ``torchrun --nproc-per-node N`` or ``horovodrun -np N``: each copy finds its place
through the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...) and calls ``md.init()``.
The launcher owns what the ranks meet through (the shared segment, or a TCPStore on a port
the OS picks), stops every rank as soon as one fails, and exits with that rank's code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time


def run(nprocs: int, command: list[str], backend: str = "local", device: str = "cpu",
        timeout: float | None = None) -> int:
    """Run ``command`` (``[script, args...]`` or ``["-m", module, args...]``) on N ranks."""
    if nprocs < 1:
        raise SystemExit(f"minidist run: -n must be at least 1, got {nprocs}")
    base = dict(os.environ, WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                MINIDIST_BACKEND=backend, MINIDIST_DEVICE=device,
                OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS",
                                               str(max(1, (os.cpu_count() or 1) // nprocs))))
    if timeout is not None:
        base["MINIDIST_TIMEOUT"] = str(timeout)
    seg = store = None
    if backend == "local":
        from ..transports.shm_segment import Segment

        seg = Segment.create(nprocs)
        base["MINIDIST_SHM"] = seg.name
    else:
        store = host_store()
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                    MINIDIST_STORE_PORT=str(store.port))
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(nprocs):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen([sys.executable, *command], env=env,
                                          preexec_fn=_die_with_parent))
        return _supervise(procs, seg)
    except KeyboardInterrupt:
        print("minidist run: interrupted; stopping all ranks", file=sys.stderr)
        return 130
    finally:
        _stop(procs)
        if seg is not None:
            if seg.name:
                seg.unlink()
            seg.close()


def _supervise(procs: list[subprocess.Popen], seg) -> int:
    """Wait for all ranks; on the first failure report it and return its exit code."""
    while True:
        if seg is not None and seg.name and seg.all_attached():
            seg.unlink()  # every rank has mapped it: the name is no longer needed
            seg.name = None
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            why = f"signal {-code}" if code < 0 else f"exit code {code}"
            print(f"minidist run: rank {rank} failed ({why}); stopping the other ranks",
                  file=sys.stderr)
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.02)


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
    """A TCPStore on a port the OS picks, so concurrent launches never collide on a port.
    (The ranks are started with fork+exec, so its server thread cannot hurt them.)"""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60),
                         wait_for_workers=False)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
