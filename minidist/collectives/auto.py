"""``algorithm="auto"``: a backend's own fast path where there is one, else the algorithm
the measured alpha-beta figures predict to be fastest for this size and world size.

Fast paths:

* ``torch`` backend, world communicator: ``torch.distributed.all_reduce`` itself (gloo or
  NCCL tune their own algorithms). Split-off communicators are not process groups, so they
  use minidist's algorithms. These bytes do not show up in ``comm.stats``.
* ``local`` backend, world communicator, CPU tensor: the shared-memory reduction of
  ``collectives/shared_memory.py`` competes with the message-passing algorithms on its
  measured figures.

The figures: ``minidist bench collectives`` fits t(n) = alpha + n / beta per algorithm and
world size over its sweep (least squares on relative error) and prints them as
``MEASURED``; the table below is that output on the development machine. World sizes not in
it use the nearest measured one (in log scale). With these figures, on a local-backend world
communicator ``auto`` takes recursive doubling up to about 390 KB (p=2) or 48 KB (p=4) and
the shared-memory path above; on a split-off communicator, recursive doubling and then ring
from about 3 MB (p=2), or naive from about 200 KB and halving-doubling from about 790 KB
(p=4, where 4 ranks share 2 cores). Split-off communicators of the torch backend use the
same table, although it was measured on the local backend. Rerun the benchmark on another
machine and paste its table here to retune.
"""

from __future__ import annotations

import math

import torch

from . import shared_memory as shm_collectives

# Fitted by `flock /tmp/minidist-heavy.lock minidist bench collectives --json c.json` on
# 2026-11-30 (2-core AMD EPYC VM, 24 GiB, Python 3.11, torch 2.13 CPU; float32, 4 B to
# 64 MiB, best of 3 rounds). world_size: {path: (alpha in microseconds, beta in GB/s)}.
# gloo's all_reduce in the same run: p=2 (339.9, 1.288), p=4 (1108.6, 0.466).
# With 4 ranks on 2 cores every message waits for a context switch, hence the large alphas.
MEASURED = {
    2: {"naive": (54.7, 2.535), "tree": (54.8, 2.424), "ring": (93.0, 5.158),
        "recursive_doubling": (44.6, 4.612), "halving_doubling": (79.1, 4.811),
        "shm": (70.5, 7.625)},
    4: {"naive": (389.6, 0.695), "tree": (415.8, 0.677), "ring": (885.6, 0.862),
        "recursive_doubling": (354.3, 0.586), "halving_doubling": (614.2, 0.975),
        "shm": (407.9, 1.835)},
}


def choose(comm, x: torch.Tensor, nbytes: int | None = None) -> str:
    """The name of the path ``auto`` takes for ``x`` (or ``nbytes`` of its kind) on ``comm``."""
    if _native_ok(comm, x):
        return "native"
    table = MEASURED[min(MEASURED, key=lambda q: abs(math.log2(q / comm.world_size)))]
    shm = shm_collectives.available(comm, x)
    nbytes = x.numel() * x.element_size() if nbytes is None else nbytes
    return min((a for a in table if a != "shm" or shm),
               key=lambda a: table[a][0] * 1e-6 + nbytes / (table[a][1] * 1e9))


def all_reduce_auto(comm, x: torch.Tensor, op: str, algorithms: dict) -> str:
    """Reduce ``x`` in place by the path ``choose`` names; returns that name. The shared-
    memory path completes ``avg`` itself; the others leave the division to the caller."""
    name = choose(comm, x)
    if name == "native":
        _native(comm, x, op)
    elif name == "shm":
        shm_collectives.all_reduce_shm(comm, x, op)
    else:
        algorithms[name](comm, x, op)
    return name


_NATIVE_OPS = {"sum": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT"}


def _native_ok(comm, x: torch.Tensor) -> bool:
    """A world communicator over a torch.distributed group, and a tensor its backend takes
    (gloo: CPU tensors, NCCL: CUDA ones)."""
    if not comm.is_world or comm.capability("process_group") is None:
        return False
    return x.is_cuda == _nccl()


def _nccl() -> bool:
    import torch.distributed as dist

    return dist.get_backend() == "nccl"


def _native(comm, x: torch.Tensor, op: str) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(x, op=getattr(dist.ReduceOp, _NATIVE_OPS[op]))
    return x  # avg: api.all_reduce divides by p afterwards, as for every algorithm
