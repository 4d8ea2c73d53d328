"""Exercise 09, communication efficiency: ``hierarchical_all_reduce`` (reduce-scatter
inside each node, all_reduce across nodes between the ranks with the same local index,
all-gather inside the node: Horovod's and NCCL's two-level all_reduce), ``topk_step`` (top-k
sparsification with error feedback; Stich et al. 2018, Lin et al. 2018) and, as the stretch
part, ``powersgd_step`` (one step of PowerSGD; Vogels et al., NeurIPS 2019).

Each runs in launched worlds on the local backend (oracles in ``ranks.py``). A node is
``per_node`` consecutive ranks (rank // per_node), as on a cluster launched node by node.
The traffic is observed, not reported: every message the learner's ranks send (their own or
a collective's) is counted by the grader's transport, per destination, and the bytes that
cross nodes are compared with the formula 2(N-1)·n·e in all (a ring across the N nodes on
each 1/per_node shard; with N = 2 or 3 nodes every all_reduce algorithm moves exactly this).
``md.all_reduce(..., algorithm="hierarchical")``, ``minidist.compression`` and torch's
PowerSGD hook are out of reach, and the shared-memory all_reduce is off so that every byte
is a message (the sandbox's ``COMM_EFFICIENCY`` rule).
"""

from ...engine.sandbox import COMM_EFFICIENCY
from ...engine.spec import Exercise, GradedTest
from . import checks

RULES = (COMM_EFFICIENCY,)
EXERCISE = Exercise("09_communication_efficiency", (
    GradedTest("test_hierarchical_all_reduce", 5, ("hierarchical_all_reduce",),
               checks.check_hierarchical, RULES),
    GradedTest("test_topk_step", 5, ("topk_step",), checks.check_topk, RULES),
    GradedTest("test_powersgd_step", 3, ("powersgd_step",), checks.check_powersgd, RULES,
               part="stretch"),
))
