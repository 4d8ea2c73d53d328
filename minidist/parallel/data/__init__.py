"""Data parallelism: replicas of the whole model, gradients averaged across ranks.

``DataParallelNaive`` (``naive.py``) beside ``DistributedDataParallel`` (``ddp.py``, with its
``Reducer`` and buckets), and ``DistributedSampler`` (``sampler.py``), each rank's shard.
"""

from .ddp import DistributedDataParallel
from .naive import DataParallelNaive
from .sampler import DistributedSampler

__all__ = ["DataParallelNaive", "DistributedDataParallel", "DistributedSampler"]
