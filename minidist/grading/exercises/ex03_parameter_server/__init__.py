"""Exercise 03, a parameter server: its synchronous step (``sync_step``), the
stale-synchronous admission rule (``ssp_admits``) and, the stretch part, an SSP server that
applies each push at once and holds fast workers back (``ssp_serve``).

Rank 0 runs the learner's server; ranks 1..W are the grader's workers, worker 1 a straggler
(``ranks.py``). The references: one process averaging every worker's gradient (sync), the
rule of Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel Parameter
Server" (NIPS 2013) (``ssp_admits``), and every message the server sends or receives, checked
as it happens by the probe. ``md.ParameterServer`` is out of reach while they run
(``sandbox.PARAM_SERVER``), and so are minidist's collectives (the server is built from
point-to-point messages).
"""

from ...engine.sandbox import COLLECTIVES, PARAM_SERVER, SENDRECV
from ...engine.spec import Exercise, GradedTest
from . import checks

RULES = (PARAM_SERVER, COLLECTIVES, SENDRECV)
EXERCISE = Exercise("03_parameter_server", (
    GradedTest("test_sync_step", 6, ("sync_step",), checks.check_sync_step, RULES),
    # practice: the rule is one line of the paper, quoted in the text above the cell
    GradedTest("test_ssp_admits", 0, ("ssp_admits",), checks.check_ssp_admits, RULES,
               part="practice"),
    GradedTest("test_ssp_serve", 4, ("ssp_serve",), checks.check_ssp_serve, RULES, part="stretch"),
))
