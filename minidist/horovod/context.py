"""``hvd.init()`` and what it knows: the communicator, the ranks by host, the engine.

Horovod's API is process-global by design (``hvd.rank()`` takes no argument), so this
module keeps one ``Context`` per process, in ``_CURRENT``: the only state of
``minidist.horovod``, set by ``init`` and cleared by ``shutdown``, and readable as
``context()``. Everything else takes it from there.

Hosts: Horovod groups ranks by host name (``HOROVOD_HOSTNAME`` overrides the machine's,
as its launcher does). ``local_rank`` is a rank's index among the ranks on its host,
``cross_rank`` its index among the ranks with its ``local_rank`` (one per host in a
homogeneous job), both by global rank.
"""

from __future__ import annotations

import atexit
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import collectives as C
from .engine import Engine

_HOST_BYTES = 64


@dataclass
class Context:
    comm: object
    owned: bool  # init() made the communicator (md.init), so shutdown() closes it
    hosts: list[str]
    engine: Engine

    def local_group(self) -> list[int]:
        me = self.hosts[self.comm.rank]
        return [r for r, h in enumerate(self.hosts) if h == me]

    def cross_group(self) -> list[int]:
        local = self.local_group().index(self.comm.rank)
        by_host: dict[str, list[int]] = {}
        for r, h in enumerate(self.hosts):
            by_host.setdefault(h, []).append(r)
        return [ranks[local] for ranks in by_host.values() if len(ranks) > local]


_CURRENT: list[Context] = []  # zero or one Context: see the module docstring


def init(comm=None) -> None:
    """Start minidist.horovod on ``comm`` (an ``md.Communicator``, e.g. the one
    ``md.launch`` passes), or without one on ``md.init()``'s: the world that ``minidist
    run -n N``, ``torchrun`` or a plain ``python`` (one rank) started. A second call while
    initialized does nothing, as in Horovod. Until ``shutdown()`` the background thread
    runs its collectives on ``comm`` itself (the world communicator keeps its fast paths):
    call no minidist collective on ``comm`` while an hvd call may still be in flight."""
    if _CURRENT:
        if comm is not None and comm is not _CURRENT[0].comm:
            raise RuntimeError("minidist.horovod is already initialized on another "
                               "communicator; call hvd.shutdown() first")
        return
    owned = comm is None
    if owned:
        from ..launch import init as md_init

        comm = md_init()
    hosts = _gather_hosts(comm)
    _CURRENT.append(Context(comm, owned, hosts, Engine(comm)))
    if owned:
        atexit.register(shutdown)


def _gather_hosts(comm) -> list[str]:
    name = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    raw = name.encode()[:_HOST_BYTES]
    mine = torch.zeros(_HOST_BYTES, dtype=torch.uint8)
    mine[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    got = C.all_gather(comm, mine)
    return [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in got]


def shutdown() -> None:
    """Stop the background thread; close the communicator if ``init`` opened it."""
    if not _CURRENT:
        return
    ctx = _CURRENT.pop()
    ctx.engine.close()
    if ctx.owned:
        atexit.unregister(shutdown)
        ctx.comm.close()


def context() -> Context:
    if not _CURRENT:
        raise ValueError("minidist.horovod has not been initialized; call hvd.init() first")
    return _CURRENT[0]


def is_initialized() -> bool:
    return bool(_CURRENT)


def size() -> int:
    """The number of ranks."""
    return context().comm.world_size


def rank() -> int:
    """This process's rank, 0 .. size() - 1."""
    return context().comm.rank


def local_rank() -> int:
    """This rank's index among the ranks on its host."""
    ctx = context()
    return ctx.local_group().index(ctx.comm.rank)


def local_size() -> int:
    """The number of ranks on this rank's host."""
    return len(context().local_group())


def cross_rank() -> int:
    """This rank's index among the ranks with its local_rank (its host's index, in a
    homogeneous job)."""
    ctx = context()
    return ctx.cross_group().index(ctx.comm.rank)


def cross_size() -> int:
    """The number of ranks with this rank's local_rank (the number of hosts, in a
    homogeneous job)."""
    return len(context().cross_group())


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    hosts = context().hosts
    return len({hosts.count(h) for h in hosts}) == 1


def mpi_built() -> bool:
    """False: minidist has no MPI transport."""
    return False


def gloo_built() -> bool:
    """Whether torch.distributed's gloo is here (minidist's torch backend on CPU)."""
    return dist.is_available() and dist.is_gloo_available()


def nccl_built() -> bool:
    """Whether torch.distributed's NCCL is here (minidist's torch backend on CUDA)."""
    return dist.is_available() and dist.is_nccl_available()


def cuda_built() -> bool:
    """Whether this torch was built with CUDA."""
    return torch.version.cuda is not None
