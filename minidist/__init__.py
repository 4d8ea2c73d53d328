"""minidist: distributed deep-learning training, from send/recv up, for learning.

    import minidist as md

    def work(comm):
        x = torch.full((4,), float(comm.rank))
        comm.send(x, dst=(comm.rank + 1) % comm.world_size)
        ...

    md.launch(work, world_size=4)

See docs/architecture.md for the layers and where each thing lives.
"""

from . import compression, costmodel, faults, models, torch_backend
from .collectives import (
    ALL_REDUCE_ALGORITHMS,
    Topology,
    all_gather,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .comm import ANY_SOURCE, UNDEFINED, CommStats, Communicator, PeerStats, Request
from .errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeout,
    MessageMismatchError,
    MinidistError,
    PeerLeftError,
    WorkerError,
)
from .faults import inject_delay, slow_rank
from .launch import RankFailed, Results, init, launch
from .parallel import elastic, pipeline
from .parallel.amp import GradScaler, MixedPrecision
from .parallel.data import (
    DataParallelNaive,
    DistributedDataParallel,
    DistributedSampler,
    LocalSGD,
)
from .parallel.hybrid import HybridGPT
from .parallel.mesh import DeviceMesh
from .parallel.param_server import ParameterServer
from .parallel.pipeline import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleNaive,
)
from .parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelGPT,
    VocabParallelEmbedding,
    parallelize_gpt,
    vocab_parallel_cross_entropy,
)
from .parallel.zero import ZeRO
from .trace import Timeline, plot_gantt, to_chrome_trace
from .transports.compute import Compute
from .transports.network import Link, Network

torch_backend.register()  # so dist.init_process_group("minidist") works after import minidist

__version__ = "0.1.0"

__all__ = [
    "ANY_SOURCE", "UNDEFINED", "Communicator", "Request", "CommError", "CommTimeout",
    "MessageMismatchError", "MinidistError", "PeerLeftError", "WorkerError", "Results", "launch",
    "init", "RankFailed",
    "CommStats", "PeerStats", "Timeline", "plot_gantt", "to_chrome_trace",
    "ALL_REDUCE_ALGORITHMS", "CollectiveMismatchError", "all_gather", "all_reduce",
    "all_reduce_coalesced", "all_to_all", "broadcast", "gather", "reduce", "reduce_scatter",
    "scatter", "Topology",
    "DataParallelNaive", "DistributedDataParallel", "DistributedSampler",
    "ParameterServer",
    "PipelineStage", "ScheduleNaive", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
    "pipeline",
    "costmodel", "models",
    "faults", "inject_delay", "slow_rank",
    "Link", "Network", "Compute",
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "TensorParallelGPT",
    "parallelize_gpt", "vocab_parallel_cross_entropy",
    "ZeRO",
    "GradScaler", "MixedPrecision", "compression",
    "DeviceMesh", "HybridGPT",
    "LocalSGD",
    "elastic", "torch_backend",
]
