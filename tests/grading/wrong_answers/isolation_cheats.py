"""Answers that try to reach the grader instead of computing (issue 27): the grader's stack
frames through ``inspect``, its reference tensors through ``gc.get_objects()``, the original
of an observed library function through its wrapper's globals, a switched-off module's
source text run with ``exec``, a grandchild that double-forks out of the test's session, and
a kill of the test process's parent. Each test runs in a fresh process holding only the
learner's functions and its own inputs, so each loses the points (or, for the double fork
and the kill, the grade simply goes on)."""

from . import Wrong

EX09, EX00 = "09_communication_efficiency", "00_getting_started"
HIER = "test_hierarchical_all_reduce"
HIER_DEF = "def hierarchical_all_reduce(comm, t, per_node):\n"
NOT_SUMMED = "expected the sum over all"
RIGHT_SHIFT = """\
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    received = torch.empty_like(t)
    request = comm.irecv(received, src=left)
    comm.send(t, dst=right)
    request.wait()
    return received
"""

WRONG = [
    Wrong("cheat_inspect_grader_frames", EX09, {"hierarchical_all_reduce": HIER_DEF + """\
    import inspect
    for frame in inspect.stack():  # a check's oracle, if the grader's frames were here
        for value in frame.frame.f_locals.values():
            if isinstance(value, torch.Tensor) and value is not t and \\
                    value.shape == t.shape and value.dtype == t.dtype:
                t.copy_(value)
    return t
"""}, {HIER: NOT_SUMMED}),
    Wrong("cheat_gc_reference_tensors", EX09, {"hierarchical_all_reduce": HIER_DEF + """\
    import gc
    best = None  # the grader's summed reference is the largest tensor of t's shape
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o is not t and o.shape == t.shape and \\
                o.dtype == t.dtype and (best is None or float(o.sum()) > float(best.sum())):
            best = o
    if best is not None and float(best.sum()) > float(t.sum()):
        t.copy_(best)
    return t
"""}, {HIER: NOT_SUMMED}),
    Wrong("cheat_wrapper_globals_original", EX09, {"hierarchical_all_reduce": HIER_DEF + """\
    import minidist.collectives.api as api
    table = vars(api)["__minidist_grader_observed__"]
    original = table["all_reduce"][0]  # the library's own, around the grader's refusal
    original(comm, t, algorithm="hierarchical")
    return t
"""}, {HIER: "is not allowed in this exercise"}),
    Wrong("cheat_exec_library_source", EX09, {"hierarchical_all_reduce": HIER_DEF + """\
    import minidist.collectives.hierarchical as switched_off
    namespace = {"__name__": "copy"}
    exec(open(switched_off.__file__).read(), namespace)  # its text, unrefused
    namespace["hierarchical"](comm, t.reshape(-1), "sum")
    return t
"""}, {HIER: "not readable by the code under test is not allowed in this exercise"}),
    Wrong("cheat_double_fork_survivor", EX00, {"ring_shift": """\
import os as _os
import time as _time


def ring_shift(comm, t):
    if _os.fork() == 0:  # a survivor: out of the test's session, sleeping past its limit
        _os.setsid()
        if _os.fork() == 0:
            _time.sleep(600)
        _os._exit(0)
""" + RIGHT_SHIFT}, passes=True),
    Wrong("cheat_kill_the_grader", EX00, {"fit_alpha_beta": """\
def fit_alpha_beta(sizes, seconds):
    import os
    import signal
    os.kill(os.getppid(), signal.SIGKILL)  # the grader, were it the parent
    t = np.asarray(seconds, dtype=float)
    rows = np.stack([np.ones(len(t)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(rows / t[:, None], np.ones(len(t)), rcond=None)
    return float(alpha), float(1 / inv_beta)
"""}, passes=True),
    Wrong("cheat_rank_kills_its_launcher", EX00, {"ring_shift": """\
def ring_shift(comm, t):
    import os
    import signal
    os.kill(os.getppid(), signal.SIGKILL)  # the process that launched the ranks
    return t
"""}, {"test_ring_shift": "ended without a result"}),
]
