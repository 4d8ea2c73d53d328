"""Exercise 04, pipeline parallelism by hand: one stage's 1F1B action list
(``schedule.py``), judged by running every stage's list against the others, and a stage's
sends and receives of activations and gradients, then a whole step of one stage
(``stages.py``, the stretch part), judged against one process on the whole batch."""

from ...engine.sandbox import PIPELINE
from ...engine.spec import Exercise, GradedTest
from . import schedule, stages

EXERCISE = Exercise("04_pipeline_parallel", (
    GradedTest("test_one_f_one_b", 4, ("one_f_one_b",), schedule.check_one_f_one_b,
               rules=(PIPELINE,)),
    GradedTest("test_forward_step", 3, ("forward_step",), stages.check_forward_step,
               rules=(PIPELINE,)),
    GradedTest("test_backward_step", 3, ("backward_step",), stages.check_backward_step,
               rules=(PIPELINE,)),
    GradedTest("test_pipeline_step", 3, ("pipeline_step",), stages.check_pipeline_step,
               rules=(PIPELINE,), part="stretch"),
))
