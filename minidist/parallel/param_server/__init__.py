"""Parameter servers: workers push gradients to servers that own the parameters and pull the
parameters back, synchronously, asynchronously or with bounded staleness.

The design of DistBelief's Downpour SGD (Dean et al., NIPS 2012) and of ps-lite (Li et al.,
"Scaling Distributed Machine Learning with the Parameter Server", OSDI 2014): ranks
``0..num_servers-1`` are servers, each owning a shard of the parameters (by key, as ps-lite's
key ranges and MXNet's kvstore do); the other ranks are workers that compute gradients.

    ps = md.ParameterServer(comm, model, num_servers=1, mode="sync",   # "sync"|"async"|"ssp"
                            staleness=0, optimizer_class=torch.optim.SGD, lr=0.1)
    if ps.is_server:
        ps.serve()                  # returns once every worker has called close() (or left)
    else:
        for x, y in data:
            ps.pull()               # the current parameters into the local model
            loss_fn(model(x), y).backward()
            ps.push()               # the gradients to the servers, each its own shard
        ps.close()
    print(ps.report())              # ServerReport or WorkerReport (``reports.py``)

Files: ``parameter_server.py`` (``ParameterServer``: checks, roles, the facade),
``sharding.py`` (which server owns which slice: whole tensors spread for balance, big tensors
sliced; how a shard travels: big pieces in place, small ones packed), ``server.py`` (the
serving loop: any-source receive, membership), ``rules.py`` (the sync / async / SSP rules as
small pure functions), ``worker.py`` (pull, push, close), ``messages.py`` (message kinds and
tags), ``reports.py`` (the reports; bytes and time per step, PS against ring all_reduce,
are the cost model's: ``costmodel/ps.py``, ``costmodel/dp.py``), and ``torch_rpc.py``: the real
system to compare with, PyTorch's RPC parameter server from its tutorial, runnable under
``md.launch``. ``WorkerLeftError`` lives with the other errors in ``minidist/errors.py``.

The naive version is ``num_servers=1``: one server holds and receives everything, W*N bytes
per sync step; ``num_servers=S`` divides that by S (``costmodel/ps.py``, ``minidist bench ps``).
"""

from ...errors import WorkerLeftError
from .parameter_server import MODES, ON_WORKER_EXIT, ParameterServer
from .reports import ServerReport, WorkerReport
from .sharding import Piece, Segment, ShardPlan, plan_shards

__all__ = ["MODES", "ON_WORKER_EXIT", "ParameterServer", "Piece", "Segment", "ServerReport",
           "ShardPlan", "WorkerLeftError", "WorkerReport", "plan_shards"]
