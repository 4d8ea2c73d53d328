"""minidist as a torch.distributed backend: torch's own DDP, FSDP2, pipelining and DTensor
over minidist's collectives (or a learner's own all-reduce).

    import torch.distributed as dist
    import minidist as md

    def train(comm):
        md.torch_backend.init_process_group(comm)          # all_reduce=my_ring to plug one in
        model = torch.nn.parallel.DistributedDataParallel(make_model())
        ...
        print(md.torch_backend.call_counts())              # what torch asked the backend for
        dist.destroy_process_group()

    md.launch(train, 4)

Under torchrun or ``minidist run``, ``import minidist`` has registered the backend, so a
plain torch script says ``dist.init_process_group("minidist")``. The process group is
``process_group.py``; the private torch APIs it needs, and the torch versions it is tested
on, are in ``torch_private.py`` (checked when a group is first made).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from .torchrun_world import Options, create

BACKEND = "minidist"

__all__ = ["BACKEND", "call_counts", "init_process_group", "register"]


def register() -> None:
    """Register backend "minidist" with torch.distributed (``import minidist`` does)."""
    if dist.is_available():
        dist.Backend.register_backend(BACKEND, create, extended_api=True,
                                      devices=["cpu", "cuda"])


def init_process_group(comm, all_reduce=None, timeout: float | None = None):
    """Make torch.distributed's default process group run over ``comm`` (a local-backend
    world Communicator, inside ``md.launch`` or ``md.init``); returns that group.

    ``all_reduce``: a function ``f(comm, tensor, op="sum")`` that reduces ``tensor`` in
    place over ``comm``'s ranks (op one of "sum", "avg", "max", "min", "prod"); it replaces
    the backend's all-reduce (single and coalesced), so torch's DDP trains over it. It
    gets a communicator of its own (a split of ``comm``), so its messages never meet
    torch's. The store torch needs is a TCPStore on 127.0.0.1 hosted by rank 0.
    ``timeout``: seconds torch's own waits (its store) may take; by default the comm's.
    """
    from ..comm import Communicator
    from . import torch_private  # noqa: F401 (refuses an untested torch, by name)

    if not isinstance(comm, Communicator):
        raise TypeError("minidist backend: init_process_group: comm must be a "
                        f"md.Communicator (from md.launch or md.init), got {type(comm).__name__}")
    if comm.backend != "local" or not comm.is_world:
        raise ValueError("minidist backend: init_process_group: comm must be the world "
                         "communicator of the local backend (md.launch(fn, n) or md.init() "
                         f"under minidist run), got {comm!r}"
                         + (" (a split)" if not comm.is_world else ""))
    if all_reduce is not None and not callable(all_reduce):
        raise TypeError("minidist backend: init_process_group: all_reduce must be a function "
                        f"f(comm, tensor, op='sum'), got {type(all_reduce).__name__}")
    if dist.is_initialized():
        raise RuntimeError("minidist backend: init_process_group: torch.distributed is already "
                           "initialised in this process; call dist.destroy_process_group() "
                           "first")
    seconds = comm.timeout if timeout is None else float(timeout)
    if not seconds > 0:
        raise ValueError(f"minidist backend: init_process_group: timeout must be a positive "
                         f"number of seconds, got {timeout!r}")
    limit = datetime.timedelta(seconds=min(seconds, 10**9))
    register()
    dist.init_process_group(BACKEND, store=_loopback_store(comm, limit), rank=comm.rank,
                            world_size=comm.world_size, timeout=limit,
                            pg_options=Options(comm, all_reduce))
    return dist.group.WORLD


def _loopback_store(comm, timeout: datetime.timedelta):
    """Rank 0 hosts a TCPStore on 127.0.0.1 and broadcasts its port over ``comm``."""
    from ..collectives import broadcast
    from ..launch.loopback import LOOPBACK, host_loopback_store

    store = host_loopback_store(comm.world_size, timeout) if comm.rank == 0 else None
    port = torch.tensor([store.port if store is not None else 0], dtype=torch.int64)
    broadcast(comm, port, src=0)
    if store is None:
        store = dist.TCPStore(LOOPBACK, int(port), comm.world_size, False, timeout)
    return store


def call_counts(group=None) -> dict[str, int]:
    """How many times torch called each operation on a minidist group (the default group
    unless ``group`` is given), by torch.distributed's names: ``all_reduce``,
    ``broadcast``, ``all_gather_into_tensor``, ``send``, ..."""
    from .process_group import ProcessGroupMinidist

    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, ProcessGroupMinidist):
        raise TypeError(f"minidist backend: call_counts: {pg!r} is not a minidist process group")
    return dict(pg.call_counts)
