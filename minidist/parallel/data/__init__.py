"""Data parallelism: replicas of the whole model, gradients averaged across ranks.

``DataParallelNaive`` (``naive.py``) beside ``DistributedDataParallel`` (``ddp.py``): its
``BucketScheduler`` (``scheduler.py``: hooks, bucket order, the communication thread,
``no_sync``), the ``Bucket`` layout (``buckets.py``) and the pluggable ``BucketReduction``
(``reductions.py``: ``Average``, ``CommHook``, ``Wrapped``); and ``DistributedSampler``
(``sampler.py``), each rank's shard; ``LocalSGD`` and ``accumulate_gradients``
(``local_sgd.py``): synchronising less often.
"""

from .ddp import DistributedDataParallel
from .local_sgd import LocalSGD, accumulate_gradients, average_parameters, local_sgd_bytes
from .naive import DataParallelNaive
from .reductions import Average, BucketReduction, CommHook, Wrapped
from .sampler import DistributedSampler
from .scheduler import BucketScheduler, SyncSwitch

__all__ = ["Average", "BucketReduction", "BucketScheduler", "CommHook", "DataParallelNaive",
           "DistributedDataParallel", "DistributedSampler", "SyncSwitch", "Wrapped",
           "LocalSGD", "accumulate_gradients", "average_parameters", "local_sgd_bytes"]
