"""Exercise 02, data parallelism by hand: the sampler's shards and DDP's bucket assignment
and the stages of its mechanism, a hook per parameter, buckets reduced in order as soon as
they are ready, and the same buckets reduced on a thread while backward goes on (the last
one the stretch part).

References are the real systems: ``torch.utils.data.DistributedSampler`` for the shards,
the bucket assignment of ``md.DistributedDataParallel``
(``minidist.parallel.data.buckets.assign_buckets``, the rule of PyTorch's
``_compute_bucket_assignment_by_size`` for one dtype), and one process training on the
whole batch for the stages."""

from ...engine.sandbox import BUCKETS, DATA_PARALLEL, SAMPLER
from ...engine.spec import Exercise, GradedTest
from . import checks, ranks

EXERCISE = Exercise("02_data_parallel", (
    GradedTest("test_shard_indices", 2, ("shard_indices",), checks.check_shard_indices, (SAMPLER,)),
    GradedTest("test_register_allreduce_hooks", 3, (ranks.NAMES["hooks"],),
               checks.check_allreduce_hooks, (DATA_PARALLEL,)),
    GradedTest("test_assign_buckets", 2, ("assign_buckets",), checks.check_assign_buckets,
               (BUCKETS,)),
    GradedTest("test_register_bucket_hooks", 4, (ranks.NAMES["buckets"],),
               checks.check_bucket_hooks, (DATA_PARALLEL,)),
    GradedTest("test_register_overlapped_hooks", 3, (ranks.NAMES["overlap"],),
               checks.check_overlapped_hooks, (DATA_PARALLEL,), part="stretch"),
))
