"""Exercise 06, ZeRO stage 1 by hand (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", SC 2020).

``shard_bounds`` is judged against the layout of ``md.ZeRO`` (``FlatShards``: the flat vector
padded with zeros to a multiple of p, cut into p equal shards). ``zero1_step`` runs in
launched worlds of 1 to 4 ranks, on vectors whose size does not divide by the world size,
for three steps of SGD with momentum and of AdamW, against one process that steps the whole
vector with the averaged gradient (float64). Before the values, the test looks at what each
rank built its optimizer over (``ranks.OptimizerLog``): the point of stage 1 is that a rank
keeps optimizer state for its shard only. The stretch, ``reduce_bucket``, is stage 2's
reduction of one gradient bucket into the shards that own its elements (DeepSpeed's stage 2
reduces each piece to its owner), judged over two backward passes of several buckets.
``minidist.parallel.zero``, torch's ``ZeroRedundancyOptimizer`` and process groups (so
``fully_shard``) are out of reach (``sandbox.ZERO``).
"""

from ...engine.sandbox import ZERO
from ...engine.spec import Exercise, GradedTest
from . import checks

EXERCISE = Exercise("06_zero_sharding", (
    # practice: the padded layout's index arithmetic is spelled out in the text
    GradedTest("test_shard_bounds", 0, ("shard_bounds",), checks.check_shard_bounds,
               rules=(ZERO,), part="practice"),
    GradedTest("test_zero1_step", 8, ("zero1_step",), checks.check_zero1_step, rules=(ZERO,)),
    GradedTest("test_reduce_bucket", 3, ("reduce_bucket",), checks.check_reduce_bucket,
               rules=(ZERO,), part="stretch"),
))
