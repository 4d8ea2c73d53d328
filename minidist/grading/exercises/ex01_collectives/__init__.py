"""Exercise 01, collectives from point-to-point messages: naive all_reduce, ring
reduce-scatter, ring all-gather, ring all_reduce, on world sizes 1 to 5, lengths that do not
divide evenly and 2-D tensors, with the bytes each rank sent checked against the formulas;
and the stretch part, halving-doubling all_reduce on world sizes 1 to 8 (powers of two), with
its messages (2 lg p per rank, to its lg p hypercube neighbours) and bytes (2(p-1)/p·n,
Rabenseifner 2004). minidist's and torch's collectives are out of reach while they run
(``sandbox.COLLECTIVES``)."""

from ...engine.sandbox import COLLECTIVES
from ...engine.spec import Exercise, GradedTest
from . import checks

EXERCISE = Exercise("01_collectives", (
    GradedTest("test_naive_all_reduce", 2, ("naive_all_reduce",), checks.check_naive_all_reduce,
               (COLLECTIVES,)),
    GradedTest("test_ring_reduce_scatter", 3, ("ring_reduce_scatter",),
               checks.check_ring_reduce_scatter, (COLLECTIVES,)),
    GradedTest("test_ring_all_gather", 2, ("ring_all_gather",), checks.check_ring_all_gather,
               (COLLECTIVES,)),
    GradedTest("test_ring_all_reduce", 3, ("ring_all_reduce",), checks.check_ring_all_reduce,
               (COLLECTIVES,)),
    GradedTest("test_halving_doubling_all_reduce", 3, ("halving_doubling_all_reduce",),
               checks.check_halving_doubling_all_reduce, (COLLECTIVES,), part="stretch"),
))
