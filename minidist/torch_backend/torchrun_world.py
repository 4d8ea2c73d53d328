"""How torch builds a minidist group: the creator ``register_backend`` calls.

Two ways in:

* ``md.torch_backend.init_process_group(comm)`` inside ``md.launch``: the Communicator
  already exists; it reaches the creator in torch's ``pg_options`` (no global state), and
  torch's store (which torch insists on) is a TCPStore on 127.0.0.1 that rank 0 hosts
  (``launch/loopback.py``) at a port it broadcasts over ``comm``;
* ``dist.init_process_group("minidist")`` under torchrun or ``minidist run``: after torch's
  own rendezvous, rank 0 creates a shared-memory segment and posts its name in torch's
  store, every rank attaches, and rank 0 removes the name once all have (ranks on one
  machine share memory; several machines are refused). At the script's exit the group's
  reference cycles are collected before the interpreter tears down: left to teardown,
  about half of all runs aborted there ("terminate called without an active exception",
  a C++ thread destroyed in the wrong order; seen in CI).
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
from dataclasses import dataclass

import torch


@dataclass
class Options:
    """What ``init_process_group(comm, ...)`` hands torch as ``pg_options``."""

    comm: object
    all_reduce: object = None


def create(dist_options, pg_options):
    """torch's creator for backend "minidist" (``extended_api=True``)."""
    from . import torch_private
    from .process_group import ProcessGroupMinidist

    store, rank, size, timeout, _, _ = torch_private.backend_options(dist_options)
    if isinstance(pg_options, Options):
        comm = pg_options.comm
        if (comm.rank, comm.world_size) != (rank, size):
            raise ValueError(f"minidist backend: init_process_group: torch asked for rank "
                             f"{rank} of {size}, but the communicator is rank {comm.rank} of "
                             f"{comm.world_size}")
        return ProcessGroupMinidist(comm, all_reduce=pg_options.all_reduce)
    atexit.register(gc.collect)  # before torch's own exit handlers (atexit runs LIFO)
    return ProcessGroupMinidist(join_local_world(store, rank, size, timeout))


def join_local_world(store, rank: int, size: int, timeout: datetime.timedelta):
    """A local-backend world Communicator for the ranks torch's rendezvous met."""
    from ..launch.runtime import WorldSpec, connect
    from ..transports.shm_segment import Segment

    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None and int(local) != size:
        raise RuntimeError(f"minidist backend: init_process_group: {size} ranks over several "
                           f"machines ({local} on this one); minidist's ranks share memory, "
                           "so they must all run on one machine (use gloo or NCCL across "
                           "machines)")
    seconds = timeout.total_seconds()
    seg = Segment.create(size) if rank == 0 else None
    if seg is not None:
        store.set("minidist/segment", seg.name)
    store.wait(["minidist/segment"], timeout)
    name = store.get("minidist/segment").decode()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    comm = connect(WorldSpec("local", size, shm_name=name, timeout=seconds,
                             device="cuda" if _cuda_default() else "cpu"), rank, local_rank)
    comm.barrier()  # everyone has mapped it: the name can go
    if seg is not None:
        seg.unlink()
        seg.close()
    return comm


def _cuda_default() -> bool:
    return os.environ.get("MINIDIST_DEVICE", "cpu").startswith("cuda") and \
        torch.cuda.is_available()
