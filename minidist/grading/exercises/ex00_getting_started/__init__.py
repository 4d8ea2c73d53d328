"""Exercise 00, getting started: ``ring_shift`` (one message to the right neighbour, on a
world where sends wait for their receive), ``ping_pong`` (the one-way time of a message,
timed once both ranks are ready), ``fit_alpha_beta`` (the alpha-beta model fitted to a
sweep, by relative least squares) and ``predict_transfer_time`` (alpha + n / beta)."""

from ...engine.sandbox import COLLECTIVES, FIT, PREDICT, SENDRECV
from ...engine.spec import Exercise, GradedTest
from . import checks

EXERCISE = Exercise("00_getting_started", (
    GradedTest("test_ring_shift", 2, ("ring_shift",), checks.check_ring_shift,
               (COLLECTIVES, SENDRECV)),
    GradedTest("test_ping_pong", 3, ("ping_pong",), checks.check_ping_pong, (COLLECTIVES,)),
    GradedTest("test_fit_alpha_beta", 2, ("fit_alpha_beta",), checks.check_fit_alpha_beta, (FIT,)),
    GradedTest("test_predict_transfer_time", 1, ("predict_transfer_time",),
               checks.check_predict_transfer_time, (PREDICT,)),
))
