"""``algorithm="auto"``: a backend's own fast path where there is one, else the path the
cost formulas predict to be fastest for this size and world size, with constants measured
on a real machine.

Fast paths:

* ``torch`` backend, world communicator: ``torch.distributed.all_reduce`` itself (gloo or
  NCCL tune their own algorithms). Split-off communicators are not process groups, so they
  use minidist's algorithms. These bytes do not show up in ``comm.stats``.
* ``local`` backend, world communicator, CPU tensor: the shared-memory reduction of
  ``collectives/shared_memory.py`` (``"shm"``) competes with the message-passing algorithms.

The prediction: path a on p ranks and n bytes takes ``costs.time(a, n, p, alpha, beta)``,
the formula of ``costmodel/collectives.py`` (for ring 2(p-1) alpha + 2 (p-1)/p n / beta; Thakur,
Rabenseifner and Gropp 2005) with alpha (seconds per message) and beta (bytes/s) fitted per
path and world size by ``minidist bench collectives --json PATH`` (its ``"fit"`` section).
The constants of the world size nearest to p (in log scale) are used, in p's own formula.
The table comes from, in this order: :func:`load_costs`, the file named by the environment
variable ``MINIDIST_COSTS``, or ``default_costs.json`` shipped with the package (measured on
a 2-core VM, where 4 ranks share 2 cores). Every rank must use the same table, or ranks
could take different paths: set ``MINIDIST_COSTS`` before ``md.launch``, or call
``load_costs`` before it (forked ranks inherit it) or on every rank.

With the shipped table, on a local-backend world communicator ``auto`` takes recursive
doubling up to about 300 KB (p=2) or 47 KB (p=4) and the shared-memory path above (from
p=5 on, always); on a split-off communicator recursive doubling and then ring from about
2.1 MB (p=2), or naive from about 140 KB and halving-doubling from about 570 KB (p=4).
Split-off communicators of the torch backend use the same table, although it was measured on
the local backend.

On an emulated network (``comm.capability("network")``) the links' own figures replace the
table: a uniform network or a one-node cluster gives every path its one link; a cluster of
two or more nodes gives each hop the link it crosses (``costmodel/cluster.py``'s
``cluster_time``), and
the two-level paths ``hierarchical`` and ``topology_ring`` compete too. With 2 nodes of 4
and an inter-node link 8 times slower, that picks a latency-bound path for small tensors
and ``hierarchical`` for large ones (``tests/collectives/test_topology.py``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib

import torch

from ..costmodel import cluster as cluster_costs
from ..costmodel import collectives as costs
from . import shared_memory as shm_collectives
from .topology import topology_of

DEFAULT_COSTS = pathlib.Path(__file__).with_name("default_costs.json")
_loaded: dict | None = None  # set by load_costs


def choose(comm, x: torch.Tensor, nbytes: int | None = None) -> str:
    """The name of the path ``auto`` takes for ``x`` (or ``nbytes`` of its kind) on ``comm``:
    ``"native"``, or the path of the cost table whose predicted time is least."""
    if _native_ok(comm, x):
        return "native"
    nbytes = x.numel() * x.element_size() if nbytes is None else nbytes
    net = comm.capability("network")
    if net is not None and net.nodes is not None and net.nodes > 1:
        return _choose_on_cluster(comm, net, nbytes)
    p, fit = comm.world_size, _fit_for(comm)
    shm = shm_collectives.available(comm, x)
    return min((a for a in fit if a != "shm" or shm),
               key=lambda a: costs.time(a, nbytes, p, *fit[a]))


def _choose_on_cluster(comm, net, nbytes: int) -> str:
    """On an emulated cluster of 2+ nodes: the path whose rounds, each hop paying its own
    link (``cluster_costs.cluster_time``), take least; ties go to the earlier of
    ``cluster_costs.PATHS`` (the flat paths before the two-level ones). The layout is
    ``topology_of(comm)`` (collective the first time on a split-off communicator)."""
    layout = topology_of(comm).node_of
    return min(cluster_costs.PATHS, key=lambda a: cluster_costs.cluster_time(
        a, nbytes, layout, net.intra, net.inter))


def _fit_for(comm) -> dict[str, tuple[float, float]]:
    """(alpha, beta) per path: on an emulated network, its slowest link's own figures for
    every message path (a described cluster is what the links say, not what this machine
    measured); otherwise the fitted table of the nearest measured world size."""
    net = comm.capability("network")
    if net is not None:
        links = [net.intra] if net.nodes == 1 else [net.intra, net.inter]
        slowest = min(links, key=lambda k: k.bandwidth)
        return {a: (slowest.alpha, slowest.bandwidth) for a in costs.ALL_REDUCE_PATHS
                if a != "shm"}
    p, table = comm.world_size, costs_table()
    return table[min(table, key=lambda q: abs(math.log2(q / p)))]


def costs_table() -> dict[int, dict[str, tuple[float, float]]]:
    """The table ``choose`` uses: {world size: {path: (alpha s, beta bytes/s)}}."""
    if _loaded is not None:
        return _loaded
    return _read_cached(os.environ.get("MINIDIST_COSTS") or str(DEFAULT_COSTS))


def load_costs(path=None) -> dict[int, dict[str, tuple[float, float]]]:
    """Make ``auto`` use the ``"fit"`` of the JSON file at ``path`` (as written by
    ``minidist bench collectives --json PATH``) in this process; ``None`` goes back to
    ``MINIDIST_COSTS`` or the shipped table. Returns the table now in use."""
    global _loaded
    _loaded = None if path is None else read_costs(path)
    return costs_table()


@functools.lru_cache(maxsize=8)
def _read_cached(path: str) -> dict:
    return read_costs(path)


def read_costs(path) -> dict[int, dict[str, tuple[float, float]]]:
    """The ``"fit"`` section of a cost file, checked: {world size: {path: (alpha, beta)}}.
    Paths this version does not know are skipped; each world size needs a message path."""
    try:
        with open(path) as f:
            fit = json.load(f)["fit"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read a cost table from {path}: it needs a JSON object with "
                         f"a \"fit\" section ({type(e).__name__}: {e})") from None
    if not isinstance(fit, dict) or not fit:
        raise ValueError(f"{path}: \"fit\" must map world sizes to paths")
    return {_world_size(path, p): _paths(path, p, paths) for p, paths in fit.items()}


def _world_size(path, p) -> int:
    if not str(p).isdigit() or int(p) < 1:
        raise ValueError(f"{path}: world size {p!r} in \"fit\" is not a positive integer")
    return int(p)


def _paths(path, p, paths) -> dict[str, tuple[float, float]]:
    out = {}
    for name, c in paths.items() if isinstance(paths, dict) else ():
        if name not in costs.ALL_REDUCE_PATHS:
            continue
        alpha, beta = (c.get("alpha"), c.get("beta")) if isinstance(c, dict) else (None, None)
        if not (isinstance(alpha, (int, float)) and isinstance(beta, (int, float))
                and math.isfinite(alpha) and alpha >= 0 and beta > 0):
            raise ValueError(f"{path}: fit[{p}][{name}] needs alpha >= 0 (seconds) and "
                             f"beta > 0 (bytes/s), got {c!r}")
        out[name] = (float(alpha), float(beta))
    if not set(out) - {"shm"}:
        raise ValueError(f"{path}: fit[{p}] names no all_reduce algorithm; known: "
                         f"{', '.join(costs.ALL_REDUCE_PATHS)}")
    return out


def all_reduce_auto(comm, x: torch.Tensor, op: str, algorithms: dict) -> str:
    """Reduce ``x`` in place by the path ``choose`` names; returns that name. Every path
    leaves ``avg`` as a sum: the caller divides."""
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

    dist.all_reduce(x, op=getattr(dist.ReduceOp, _NATIVE_OPS[op]),
                    group=comm.capability("process_group"))
    # gloo's and NCCL's own traffic is invisible here: record what was handed over instead
    comm.stats.on_native(x.numel() * x.element_size())
    return x  # avg: api.all_reduce divides by p afterwards, as for every algorithm
