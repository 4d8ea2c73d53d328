"""How a rank becomes a Communicator: from a spec (``md.launch``) or from the environment.

``md.init()`` reads what the launcher left in the environment:

* ``minidist run`` with the local backend sets ``MINIDIST_SHM`` (the shared segment's name);
* ``torchrun`` and ``minidist run --backend torch`` set ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (the torch.distributed convention);
* nothing at all gives a world of one rank, so a script also runs as plain ``python x.py``.
"""

from __future__ import annotations

import datetime
import logging
import math
import numbers
import os
import sys
from dataclasses import dataclass

import torch

from ..checks import one_of
from ..comm import Communicator
from ..errors import CommTimeout
from ..trace import Timeline
from ..transports.clock import CLOCKS, make_clock
from ..transports.emulated import EmulatedTransport, PortClocks
from ..transports.local import LocalTransport
from ..transports.network import Network
from ..transports.shm_segment import Segment
from ..transports.virtual import VirtualTransport
from .loopback import host_loopback_store, pin_gloo_to_loopback

BACKENDS = ("local", "torch")
DEFAULT_TIMEOUT = 60.0  # seconds, unless MINIDIST_TIMEOUT says otherwise (``check_timeout``)


@dataclass
class WorldSpec:
    """Everything a rank needs to join its world; picklable, so it crosses into children."""

    backend: str
    world_size: int
    shm_name: str | None = None
    store_host: str = "127.0.0.1"
    store_port: int | None = None
    store_meeting: tuple | None = None  # (port Value, ready Event): rank 0 hosts the store
    device: str = "cpu"
    timeout: float = DEFAULT_TIMEOUT
    trace: bool = False
    network: Network | None = None  # md.launch(network=...): emulate its links
    ports: PortClocks | None = None  # the network's shared port clocks (emulated.py)
    clock: str = "wall"  # md.launch(clock=...): "virtual" runs the network on virtual time


def check_backend_device(backend: str, device: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if str(device).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")


def check_timeout(timeout, what: str = "timeout") -> float:
    """``timeout`` as positive seconds (``inf``: wait forever); None: ``MINIDIST_TIMEOUT``,
    read now rather than at import, or 60 s when it is unset or empty."""
    if timeout is None:
        raw = os.environ.get("MINIDIST_TIMEOUT", "").strip()
        if not raw:
            return DEFAULT_TIMEOUT
        try:
            timeout, what = float(raw), f"MINIDIST_TIMEOUT={raw!r}"
        except ValueError:
            raise ValueError(f"MINIDIST_TIMEOUT={raw!r} is not a number of seconds: set it "
                             "to one (e.g. MINIDIST_TIMEOUT=60) or unset it") from None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds (int or float), got "
                        f"{type(timeout).__name__} {timeout!r:.40}")
    if not timeout > 0:  # NaN too
        raise ValueError(f"{what} must be a positive number of seconds (float('inf') for no "
                         f"limit), got {timeout}")
    return float(timeout)


def check_clock(clock, network, threads) -> str:
    """``md.launch``'s ``clock``: ``"wall"`` (default) or ``"virtual"``, which models time on
    an emulated network (so it needs one) and charges each thread's CPU time as its
    computation (so torch runs one thread per rank)."""
    one_of(clock, CLOCKS, "clock")
    if clock == "virtual" and network is None:
        raise ValueError("clock='virtual' models time on an emulated network, and none was "
                         "given: pass network=md.Network.uniform(md.Link(alpha=..., "
                         "bandwidth=...)) or md.Network.cluster(...), or use clock='wall'")
    if clock == "virtual" and threads not in (None, 1):
        raise ValueError(f"threads={threads!r} with clock='virtual': a rank's computation is "
                         "charged as the CPU time of its own thread, so torch must run one "
                         "thread per rank; leave threads unset (or 1)")
    return clock


def connect(spec: WorldSpec, rank: int, local_rank: int | None = None) -> Communicator:
    """Join the world described by ``spec`` as ``rank``; returns the world Communicator."""
    _setup_debug_log(rank)
    device = _rank_device(spec.device, rank if local_rank is None else local_rank)
    clock = make_clock(spec.clock, spec.network.compute if spec.network else None)
    if spec.backend == "local":
        transport = LocalTransport(Segment.attach(spec.shm_name), rank)
        if spec.network is not None and spec.clock == "virtual":
            transport = VirtualTransport(transport, spec.network, spec.ports, clock,
                                         spec.timeout)
        elif spec.network is not None:
            transport = EmulatedTransport(transport, spec.network, spec.ports, spec.timeout)
    else:
        transport = _torch_transport(spec, rank, device)
    comm = Communicator(transport, tuple(range(spec.world_size)), rank, timeout=spec.timeout,
                        device=device, timeline=Timeline(rank, spec.trace, clock), clock=clock)
    clock.count_flops_here()  # FLOP-model compute: this (the rank's main) thread's ops
    return comm


def _rank_device(device: str, local_rank: int) -> torch.device:
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for, but torch sees no CUDA GPU here")
    index = dev.index if dev.index is not None else local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _torch_transport(spec: WorldSpec, rank: int, device: torch.device):
    import torch.distributed as dist

    from ..transports.torch_dist import TorchTransport, as_timedelta

    timeout = as_timedelta(spec.timeout)
    pg_backend = "nccl" if device.type == "cuda" else "gloo"
    if spec.store_port is None and spec.store_meeting is None:  # torchrun: env://
        dist.init_process_group(pg_backend, init_method="env://", timeout=timeout)
    else:  # a launch on this machine: nothing listens beyond loopback
        pin_gloo_to_loopback(os.environ)
        dist.init_process_group(pg_backend, store=_store(spec, rank, timeout), rank=rank,
                                world_size=spec.world_size, timeout=timeout)
    return TorchTransport(device, owns_group=True)


def _store(spec: WorldSpec, rank: int, timeout: datetime.timedelta):
    """The TCPStore the ranks meet at. ``minidist run`` hosts one and passes its port;
    under ``md.launch`` rank 0 hosts it on loopback, on a port the OS picks, and posts the
    port."""
    import torch.distributed as dist

    if spec.store_meeting is None:
        return dist.TCPStore(spec.store_host, spec.store_port, spec.world_size,
                             is_master=False, timeout=timeout)
    port, ready = spec.store_meeting
    if rank == 0:
        store = host_loopback_store(spec.world_size, timeout)
        port.value = store.port
        ready.set()
        return store
    if not ready.wait(None if math.isinf(spec.timeout) else spec.timeout):
        raise CommTimeout("rendezvous", 0, None, spec.timeout, rank)
    return dist.TCPStore(spec.store_host, port.value, spec.world_size, is_master=False,
                         timeout=timeout)


def init(backend: str | None = None, device: str | None = None,
         timeout: float | None = None, trace: bool = False) -> Communicator:
    """This process's world Communicator, from what the launcher put in the environment."""
    env = os.environ
    timeout = check_timeout(timeout)
    device = device or env.get("MINIDIST_DEVICE", "cpu")
    if "MINIDIST_SHM" in env and backend in (None, "local"):
        spec = WorldSpec("local", int(env["WORLD_SIZE"]), shm_name=env["MINIDIST_SHM"],
                         device=device, timeout=timeout, trace=trace)
        return connect(spec, int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])))
    if "RANK" in env and "WORLD_SIZE" in env:
        port = env.get("MINIDIST_STORE_PORT")
        spec = WorldSpec("torch", int(env["WORLD_SIZE"]), device=device, timeout=timeout,
                         store_host=env.get("MASTER_ADDR", "127.0.0.1"), trace=trace,
                         store_port=int(port) if port else None)
        return connect(spec, int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])))
    if backend == "torch":
        raise RuntimeError("md.init(backend='torch') needs RANK and WORLD_SIZE in the "
                           "environment: start the script with torchrun or minidist run")
    seg = Segment.create(1, guard=False)  # a world of one: a plain `python script.py`
    seg.unlink()
    return Communicator(LocalTransport(seg, 0), (0,), 0, timeout=timeout,
                        device=_rank_device(device, 0), timeline=Timeline(0, trace))


def _setup_debug_log(rank: int) -> None:
    """``MINIDIST_DEBUG=1`` logs every message (who sends what to whom) on stderr."""
    if os.environ.get("MINIDIST_DEBUG", "0") in ("", "0"):
        return
    logger = logging.getLogger("minidist")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[minidist rank {rank}] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
