"""Exercise 05, Megatron-LM's tensor parallelism by hand (Shoeybi et al. 2019, section 3).
The learner shards an MLP's two linears (column- then row-parallel), writes the conjugate
operators f (identity forward, all-reduce backward) and g (all-reduce forward, identity
backward) as autograd functions, and puts them together into the parallel MLP; the stretch
is the vocabulary-parallel cross-entropy.

The reference is one process holding the whole layer, in float64: every rank's output and
gradients must be the full layer's (its slice, for a sharded weight), on 1, 2 and 4 ranks.
minidist's own tensor-parallel package and torch's process groups are out of reach
(``sandbox.TENSOR_PARALLEL``); ``md.all_reduce`` stays."""

from ...engine.sandbox import TENSOR_PARALLEL
from ...engine.spec import Exercise, GradedTest
from . import checks

RULES = (TENSOR_PARALLEL,)
EXERCISE = Exercise("05_tensor_parallel", (
    # practice: which slice each rank keeps is spelled out in the text above the cell
    GradedTest("test_shard_mlp", 0, ("shard_mlp",), checks.check_shard_mlp, RULES,
               part="practice"),
    GradedTest("test_copy_to_parallel", 2, (checks.F_NAME,), checks.check_copy_to_parallel, RULES),
    GradedTest("test_reduce_from_parallel", 2, (checks.G_NAME,),
               checks.check_reduce_from_parallel, RULES),
    GradedTest("test_parallel_mlp", 6, ("parallel_mlp",), checks.check_parallel_mlp, RULES),
    GradedTest("test_vocab_parallel_cross_entropy", 3, ("vocab_parallel_cross_entropy",),
               checks.check_vocab_parallel_cross_entropy, RULES, part="stretch"),
))
