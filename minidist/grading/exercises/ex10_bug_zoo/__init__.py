"""Exercise 10, the bug zoo: seven real distributed-training bugs, each fixed function graded
by an equivalence check on inputs that expose its bug (five in the core, two in the
stretch).

Oracles (``ranks.py``): one process on every rank's samples (averaged gradients),
the exact sum over ranks and the ring's byte count 2(p-1)/p·n (Patarasuk and Yuan 2009),
one process holding every shard under one skip decision (found_inf), torch's
``DistributedSampler`` with ``set_epoch``, ZeRO's padded flat layout (Rajbhandari et al.
2020), the float32 gradient (Micikevicius et al. 2018, loss scaling), and the pipeline's
layers composed in one process (1F1B, Narayanan et al. 2019). The feedback names the symptom
as it shows in a run, then the cause. The library's version of each fix is out of reach
where calling it would skip the exercise: DDP (``DATA_PARALLEL``), the collectives
(``COLLECTIVES``, for the ring), the scalers (``AMP``), ``md.ZeRO`` (``ZERO``) and the
pipeline schedules (``PIPELINE``); ``md.all_reduce``, ``md.reduce_scatter``,
``md.all_gather`` and ``md.DistributedSampler`` stay: the fixed code is built on them.
"""

from ...engine.sandbox import AMP, COLLECTIVES, DATA_PARALLEL, PIPELINE, ZERO
from ...engine.spec import Exercise, GradedTest
from . import checks

EXERCISE = Exercise("10_bug_zoo", (
    GradedTest("test_average_gradients", 2, ("average_gradients",), checks.check_average_gradients,
               (DATA_PARALLEL,)),
    GradedTest("test_ring_all_reduce", 2, ("ring_all_reduce",), checks.check_ring_all_reduce,
               (COLLECTIVES,)),
    GradedTest("test_sharded_step", 2, ("sharded_step",), checks.check_sharded_step, (AMP,)),
    GradedTest("test_train_epochs", 2, ("train_epochs",), checks.check_train_epochs),
    GradedTest("test_zero_sgd_step", 2, ("zero_sgd_step",), checks.check_zero_sgd_step, (ZERO,)),
    GradedTest("test_fp16_step", 3, ("fp16_step",), checks.check_fp16_step, (AMP,), part="stretch"),
    GradedTest("test_pipeline_1f1b", 3, ("pipeline_1f1b",), checks.check_pipeline_1f1b, (PIPELINE,),
               part="stretch"),
))
