"""``md.launch``: run a function on N ranks from a notebook cell or a script.

The ranks are processes started with the ``multiprocess`` package (multiprocessing with dill),
so a function defined in a notebook cell can be launched under fork and spawn alike. The
caller watches every rank's result pipe and process sentinel at once, so the first failure,
whether an exception or a process that simply died, is reported within milliseconds, the
other ranks are stopped, and nothing (no process, no shared-memory segment) outlives the call
(``watch.py``: collecting, blame, teardown). With ``on_rank_failure="continue"`` the others
are told of a failure instead and run on (``failures.py``). Nor does anything outlive a
killed caller: ranks die with it (PR_SET_PDEATHSIG, checked against a caller that died
first), the segment's name has a guard (``transports/shm_segment.py``), and interrupts wait
while ranks are started or torn down.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from contextlib import contextmanager

import multiprocess as mp

from ..checks import one_of, positive_int
from ..errors import CommTimeout
from ..transports.emulated import PortClocks
from ..transports.network import Network
from ..transports.virtual import PortIntervals
from .failures import RankFailed, check_on_rank_failure, collect_tolerating
from .runtime import WorldSpec, check_backend_device, check_clock, check_timeout, connect
from .watch import Results, collect, failure_kind, signals_held, teardown

__all__ = ["RankFailed", "Results", "launch"]


def launch(fn, world_size: int, args: tuple = (), kwargs: dict | None = None,
           backend: str = "local", device: str = "cpu", timeout: float | None = None,
           start_method: str | None = None, threads: int | None = None,
           trace: bool = False, network: Network | None = None,
           on_rank_failure: str = "error", clock: str = "wall") -> Results:
    """Run ``fn(comm, *args, **kwargs)`` on ``world_size`` ranks; return results by rank.

    ``timeout`` bounds every blocking communication call (``md.CommTimeout`` past it); by
    default ``MINIDIST_TIMEOUT`` (read at each launch) or 60 s; ``float("inf")``: no bound.
    ``start_method`` is ``"fork"`` (default on Linux for CPU work: fast) or ``"spawn"``
    (default for CUDA, which cannot survive a fork). ``threads`` is each rank's torch thread
    count: by default cores / ranks under spawn, and 1 under fork, because a child forked
    after the parent ran an OpenMP-parallel torch op hangs in its first parallel region.
    ``network`` (an ``md.Network``, local backend only) makes every message take the time
    its link would take on that network (``transports/emulated.py``). ``clock="virtual"``
    (with a ``network``) runs it on virtual time instead: nobody sleeps, each rank's
    computation is charged as its CPU time (or, with ``network.compute``, as its FLOPs at
    that rate) and ``comm.now()``, the timeline and every message's time are modelled, so
    the figures do not depend on this machine or its load (``transports/virtual.py``).

    ``on_rank_failure``: ``"error"`` (default): the first rank that raises or dies stops
    every rank and ``md.WorkerError`` names it. ``"continue"`` (local backend only), for
    programs that can do without a rank (an asynchronous parameter server's workers): the
    others are told (their receives from it raise ``md.PeerLeftError``) and run on, and the
    returned list holds an ``md.RankFailed`` in the failed rank's slot (``.failures`` lists
    them); a failure the others cannot survive still raises (``failures.py``).
    """
    world_size, args, kwargs = _check_launch_args(fn, world_size, args, kwargs)
    timeout = check_timeout(timeout)
    check_backend_device(backend, device)
    tolerate = check_on_rank_failure(on_rank_failure, backend)
    _check_network(network, backend, world_size)
    check_clock(clock, network, threads)
    method = _start_method(start_method, device)
    threads = 1 if clock == "virtual" else _thread_count(threads, method, world_size)
    ctx = mp.get_context(method)
    if method == "fork":
        _preload_for_ranks()
    procs, conns, spec, owned, ok = [], [], None, None, False
    try:
        with signals_held():  # nothing is created that the finally below would not see
            spec, owned = _prepare_world(backend, world_size, device, timeout, trace, ctx,
                                         network, clock)
        _start_ranks(ctx, method, spec, threads, (fn, args, kwargs), procs, conns)
        results = (collect_tolerating if tolerate else collect)(procs, conns, owned)
        ok = True
        return results
    except KeyboardInterrupt:
        raise LaunchInterrupted(len(procs)) from None
    finally:
        with signals_held():
            teardown(procs, conns, owned, grace=1.0 if ok else 0.0)
            if spec is not None and spec.ports is not None:
                spec.ports.close()


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or the notebook's stop button) during ``md.launch``: every rank was stopped.
    In IPython and Jupyter it shows as one line, not a traceback through ``multiprocess``."""

    def __init__(self, ranks: int):
        super().__init__(f"interrupted: {ranks} rank{'s' if ranks != 1 else ''} stopped")

    def _render_traceback_(self) -> list[str]:  # IPython's hook for how an error is shown
        return [str(self)]


def _preload_for_ranks() -> None:
    """Import once, in the caller, what every forked rank would otherwise import on its own:
    torch's optimizers import ``torch._dynamo`` on first construction (about 0.8 s of CPU
    per rank per launch here, several seconds for 4 ranks on 2 cores); forked ranks then
    share the already-imported module."""
    if "torch._dynamo" not in sys.modules:
        try:
            import torch._dynamo  # noqa: F401
        except Exception:  # an optional speed-up: never a reason to fail a launch
            pass


def _start_ranks(ctx, method: str, spec: WorldSpec, threads: int, call, procs, conns) -> None:
    """Start the ranks; each one is recorded in ``procs`` the moment it exists."""
    caller = os.getpid() if method in ("fork", "spawn") else None  # forkserver: not ours
    with _pickle_referenced_globals():
        for rank in range(spec.world_size):
            with signals_held():
                reader, writer = ctx.Pipe(duplex=False)
                conns.append(reader)
                p = ctx.Process(target=_worker, name=f"minidist-rank-{rank}",
                                args=(rank, spec, threads, caller, call, writer))
                try:
                    p.start()
                except Exception as e:
                    if method == "fork":
                        raise
                    raise _not_picklable(method, call, e) from e
                finally:
                    writer.close()
                procs.append(p)


def _not_picklable(method: str, call, error: Exception) -> Exception:
    """Which of fn, args and kwargs could not be pickled for a spawned rank, in words."""
    import dill

    fn, args, kwargs = call
    named = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
    named += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for what, value in named:
        try:
            dill.dumps(value)
        except Exception as e:
            return TypeError(
                f"{what} (a {type(value).__name__}) cannot be sent to the ranks: "
                f"start_method={method!r} pickles every argument, and this one fails ({e}). "
                f"Pass a picklable value instead (a list rather than a generator, say), "
                f"create it inside fn, or use start_method='fork'")
    return error


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


def _check_launch_args(fn, world_size, args, kwargs) -> tuple[int, tuple, dict]:
    if not callable(fn):
        raise TypeError(f"launch expects a function fn(comm, ...), got {type(fn).__name__}")
    world_size = positive_int(world_size, "world_size", TypeError)  # numpy integers too
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of fn's positional arguments, got "
                        f"{type(args).__name__} {args!r:.40}; for one argument write "
                        f"args=({args!r:.40},)")
    if kwargs is not None and not (isinstance(kwargs, dict) and
                                   all(isinstance(k, str) for k in kwargs)):
        raise TypeError(f"kwargs must be a dict of fn's keyword arguments (names to values), "
                        f"got {type(kwargs).__name__}")
    return world_size, tuple(args), dict(kwargs or {})


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


def _start_method(start_method: str | None, device: str) -> str:
    if start_method is not None:
        return one_of(start_method, mp.get_all_start_methods(), "start_method")
    if str(device).startswith("cuda") or not sys.platform.startswith("linux"):
        return "spawn"
    return "fork"


def _thread_count(threads: int | None, method: str, world_size: int) -> int:
    if threads is None:
        return 1 if method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    positive_int(threads, "threads", TypeError)
    if threads > 1 and method == "fork":
        raise ValueError(
            f"threads={threads} with start_method='fork' can deadlock: a process forked after "
            "its parent ran an OpenMP-parallel torch op hangs in its first parallel region. "
            "Use start_method='spawn' for more than one thread per rank.")
    return threads


def _prepare_world(backend, world_size, device, timeout, trace, ctx, network=None,
                   clock="wall"):
    """Create what the ranks meet through: a shared segment (and, with a network, the
    shared clocks of every rank's ports), or (torch backend) a place where rank 0 posts the
    port of the TCPStore it hosts.

    The store is not hosted here: its server thread would be running when the next ranks
    are forked, and a child forked while another thread holds a lock inherits the lock
    held forever (about one 4-rank launch in seven then hung in the rendezvous).
    """
    spec = WorldSpec(backend, world_size, device=str(device), timeout=float(timeout),
                     trace=trace, clock=clock)
    if network is not None:
        ports = PortIntervals if clock == "virtual" else PortClocks
        spec.network, spec.ports = network, ports.create(ctx, world_size)
    if backend == "local":
        from ..transports.shm_segment import Segment

        seg = Segment.create(world_size)
        spec.shm_name = seg.name
        return spec, seg
    spec.store_meeting = (ctx.Value("i", 0, lock=False), ctx.Event())
    return spec, None


def _worker(rank, spec, threads, caller, call, conn) -> None:
    _become_rank(threads, caller)
    fn, args, kwargs = call
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
                   failure_kind(e, isinstance(e, CommTimeout))))
    finally:
        if comm is not None:
            try:
                comm.close()
            except Exception:
                pass
        conn.close()


def _become_rank(threads: int, caller: int | None) -> None:
    """Per-rank process setup: die with the parent (even if it died before this line),
    leave Ctrl-C to it, share the cores."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if caller is not None and os.getppid() != caller:
            os._exit(1)  # the caller died before we asked to die with it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles interrupts
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
