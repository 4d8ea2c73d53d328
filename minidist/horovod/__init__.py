"""Horovod's PyTorch API (``horovod.torch``) on minidist: ``import minidist.horovod as hvd``.

Horovod itself (Sergeev and Del Balso 2018) does not install here (its 0.28.1 source build
forces C++14, torch 2.13's headers need C++17), so this package gives its scripts the same
names over minidist's collectives::

    import minidist.horovod as hvd
    hvd.init()                                   # under `minidist run -n 4` or torchrun
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

``hvd.init(comm)`` starts it on a communicator of your own (``md.launch``), and
``hvd.run(fn, args=(), np=N)`` is ``horovod.run``. What differs from Horovod: collectives
run in submission order (every rank must submit the same ones, with the same names, in
the same order; a mismatch is an error naming both) rather than matched by name in any
order; no Tensor Fusion; no Adasum, process sets, elastic mode, sparse or grouped
allreduce; tensors on the CPU (or wherever minidist's backend takes them).
"""

from .context import (
    cross_rank,
    cross_size,
    cuda_built,
    gloo_built,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    nccl_built,
    rank,
    shutdown,
    size,
)
from .engine import HorovodInternalError
from .functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .mpi_ops import (
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    join,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .runner import run

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_built", "gloo_built", "nccl_built",
    "cuda_built", "HorovodInternalError",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "join", "barrier", "poll", "synchronize",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "run",
]
