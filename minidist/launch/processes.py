"""``md.launch``: run a function on N ranks from a notebook cell or a script.

The ranks are processes started with the ``multiprocess`` package (multiprocessing with dill),
so a function defined in a notebook cell can be launched under fork and spawn alike. The
caller watches every rank's result pipe and process sentinel at once, so the first failure,
whether an exception or a process that simply died, is reported within milliseconds, the
other ranks are stopped, and nothing (no process, no shared-memory segment) outlives the call.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager

import multiprocess as mp
from multiprocess.connection import wait as wait_any

from ..errors import CommTimeout, WorkerCommTimeout, WorkerError
from ..transports.emulated import PortClocks
from ..transports.network import Network
from .runtime import DEFAULT_TIMEOUT, WorldSpec, check_backend_device, connect


class Results(list):
    """The per-rank return values, in rank order. With ``trace=True``, ``timelines`` holds
    each rank's recorded events (see ``minidist.trace``)."""

    timelines: list[list[dict]] | None = None


def launch(fn, world_size: int, args: tuple = (), kwargs: dict | None = None,
           backend: str = "local", device: str = "cpu", timeout: float = DEFAULT_TIMEOUT,
           start_method: str | None = None, threads: int | None = None,
           trace: bool = False, network: Network | None = None) -> Results:
    """Run ``fn(comm, *args, **kwargs)`` on ``world_size`` ranks; return results by rank.

    ``timeout`` bounds every blocking communication call (``md.CommTimeout`` past it).
    ``start_method`` is ``"fork"`` (default on Linux for CPU work: fast) or ``"spawn"``
    (default for CUDA, which cannot survive a fork). ``threads`` is each rank's torch thread
    count: by default cores / ranks under spawn, and 1 under fork, because a child forked
    after the parent ran an OpenMP-parallel torch op hangs in its first parallel region.
    ``network`` (an ``md.Network``, local backend only) makes every message take the time
    its link would take on that network (``transports/emulated.py``).
    """
    world_size = _check_launch_args(fn, world_size, backend, device, timeout)
    _check_network(network, backend, world_size)
    method = start_method or _default_start_method(device)
    threads = _thread_count(threads, method, world_size)
    ctx = mp.get_context(method)
    spec, owned = _prepare_world(backend, world_size, device, timeout, trace, ctx, network)
    procs, conns, ok = [], [], False
    try:
        with _pickle_referenced_globals():
            for rank in range(world_size):
                reader, writer = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_worker, name=f"minidist-rank-{rank}", args=(
                    rank, spec, threads, fn, tuple(args), kwargs or {}, writer))
                p.start()
                writer.close()
                procs.append(p)
                conns.append(reader)
        results = _collect(procs, conns, owned)
        ok = True
        return results
    finally:
        _teardown(procs, conns, owned, grace=1.0 if ok else 0.0)
        if spec.ports is not None:
            spec.ports.close()


@contextmanager
def _pickle_referenced_globals():
    """Under spawn, dill pickles a notebook's function by value; with ``recurse`` it also
    carries the globals the function uses (``torch``, helper functions, constants)."""
    import dill

    before = dill.settings["recurse"]
    dill.settings["recurse"] = True
    try:
        yield
    finally:
        dill.settings["recurse"] = before


def _check_launch_args(fn, world_size, backend, device, timeout) -> int:
    if not callable(fn):
        raise TypeError(f"launch expects a function fn(comm, ...), got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    check_backend_device(backend, device)
    return world_size


def _check_network(network, backend: str, world_size: int) -> None:
    if network is None:
        return
    if not isinstance(network, Network):
        raise TypeError(
            f"network must be an md.Network, e.g. md.Network.uniform(md.Link(alpha=1e-5, "
            f"bandwidth=1e9)), got {type(network).__name__}")
    if backend != "local":
        raise ValueError(
            f"network= emulates links on top of the local backend's shared memory; it cannot "
            f"be combined with backend={backend!r} (use backend='local')")
    network.check_world(world_size)


def _default_start_method(device: str) -> str:
    if str(device).startswith("cuda") or not sys.platform.startswith("linux"):
        return "spawn"
    return "fork"


def _thread_count(threads: int | None, method: str, world_size: int) -> int:
    if threads is None:
        return 1 if method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if threads > 1 and method == "fork":
        raise ValueError(
            f"threads={threads} with start_method='fork' can deadlock: a process forked after "
            "its parent ran an OpenMP-parallel torch op hangs in its first parallel region. "
            "Use start_method='spawn' for more than one thread per rank.")
    return threads


def _prepare_world(backend, world_size, device, timeout, trace, ctx, network=None):
    """Create what the ranks meet through: a shared segment (and, with a network, the
    shared clocks of every rank's ports), or (torch backend) a place where rank 0 posts the
    port of the TCPStore it hosts.

    The store is not hosted here: its server thread would be running when the next ranks
    are forked, and a child forked while another thread holds a lock inherits the lock
    held forever (about one 4-rank launch in seven then hung in the rendezvous).
    """
    spec = WorldSpec(backend, world_size, device=str(device), timeout=float(timeout),
                     trace=trace)
    if network is not None:
        spec.network, spec.ports = network, PortClocks.create(ctx, world_size)
    if backend == "local":
        from ..transports.shm_segment import Segment

        seg = Segment.create(world_size)
        spec.shm_name = seg.name
        return spec, seg
    spec.store_meeting = (ctx.Value("i", 0, lock=False), ctx.Event())
    return spec, None


def _worker(rank, spec, threads, fn, args, kwargs, conn) -> None:
    _become_rank(threads)
    comm = None
    try:
        comm = connect(spec, rank)
        result = fn(comm, *args, **kwargs)
        events = comm.timeline.as_dicts() if spec.trace else None
        try:
            conn.send(("ok", result, events))
        except Exception as e:  # the result could not be pickled
            raise TypeError(f"rank {rank} returned a {type(result).__name__} that cannot be "
                            f"sent back to the caller: {e}") from e
    except BaseException as e:
        conn.send(("error", type(e).__name__, str(e), traceback.format_exc(),
                   isinstance(e, CommTimeout)))
    finally:
        if comm is not None:
            try:
                comm.close()
            except Exception:
                pass
        conn.close()


def _become_rank(threads: int) -> None:
    """Per-rank process setup: die with the parent, leave Ctrl-C to it, share the cores."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles interrupts
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def _collect(procs, conns, owned) -> Results:
    """Wait for every rank's result; raise WorkerError for the first rank that fails."""
    n = len(procs)
    results, timelines = [None] * n, [None] * n
    pending = set(range(n))
    by_conn = {c: r for r, c in enumerate(conns)}
    by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}
    while pending:
        _unlink_when_attached(owned)
        unlinked = not getattr(owned, "name", None)
        ready = wait_any([conns[r] for r in pending] + [procs[r].sentinel for r in pending],
                         timeout=0.1 if unlinked else 0.002)
        for obj in ready:
            rank = by_conn.get(obj, by_sentinel.get(obj))
            if rank not in pending:
                continue
            msg = _read_result(conns[rank], procs[rank], obj in by_conn)
            if msg is None:
                continue  # exited; its result (if any) arrives on the pipe
            if msg[0] != "ok":
                raise _worker_error(rank, msg)
            results[rank], timelines[rank] = msg[1], msg[2]
            pending.discard(rank)
    out = Results(results)
    if any(t is not None for t in timelines):
        out.timelines = timelines
    return out


def _read_result(conn, proc, from_pipe: bool):
    """The rank's message, None if there is none yet, or a 'died' error if it is gone."""
    if conn.poll():
        try:
            return conn.recv()
        except (EOFError, OSError):
            pass
    elif from_pipe is False and proc.exitcode is None:
        return None
    proc.join(1.0)
    return ("died", proc.exitcode)


def _worker_error(rank: int, msg) -> WorkerError:
    if msg[0] == "died":
        return WorkerError(rank, f"the process died without raising ({_describe_exit(msg[1])})")
    _, exc_type, text, tb, is_timeout = msg
    cls = WorkerCommTimeout if is_timeout else WorkerError
    return cls(rank, f"{exc_type}: {text}", exc_type, tb)


def _describe_exit(code) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _unlink_when_attached(owned) -> None:
    """Remove the segment's name once every rank has mapped it: nothing can leak after."""
    if getattr(owned, "owner", False) and owned.name and owned.all_attached():
        owned.unlink()
        owned.name = None


def _teardown(procs, conns, owned, grace: float) -> None:
    """Let finished ranks exit (``grace`` seconds), stop the rest (SIGTERM, then SIGKILL),
    close the pipes and release the shared segment or store."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    for c in conns:
        c.close()
    if hasattr(owned, "all_attached"):  # a shared segment
        if owned.name:
            owned.unlink()
        owned.close()
