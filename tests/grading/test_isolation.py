"""Learner code in child processes: plain data back, time limits, and the sandbox's rules."""

from __future__ import annotations

import os
import time

import pytest
import torch

from minidist.grading.engine import sandbox
from minidist.grading.engine.isolation import (
    ChildTimeout,
    Opaque,
    RemoteError,
    run_in_child,
    sanitize,
    to_plain,
)


class Evil:
    """Unpickling this would run code: the parent must never unpickle what a child sends."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _returns(value):
    return to_plain(value)


def test_plain_data_round_trips_and_other_objects_stay_opaque():
    value = {"t": torch.arange(6, dtype=torch.int64).reshape(2, 3), "pair": (1.5, None),
             3: [True, "x"], "evil": Evil()}
    got = run_in_child(_returns, (value,))
    assert torch.equal(got["t"], value["t"]) and got["t"].dtype == torch.int64
    assert got["pair"] == (1.5, None) and got[3] == [True, "x"]
    assert isinstance(got["evil"], Opaque) and got["evil"].type_name == "Evil"
    assert sanitize(float("nan")) != sanitize(float("nan"))  # NaN survives as NaN


def _raises():
    raise KeyError("missing")


def _sleeps_with_a_grandchild():
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(60)


def test_errors_come_back_as_data_and_a_run_past_its_limit_is_killed():
    with pytest.raises(RemoteError) as info:
        run_in_child(_raises)
    assert info.value.type_name == "KeyError" and "missing" in info.value.message
    start = time.monotonic()
    with pytest.raises(ChildTimeout):
        run_in_child(_sleeps_with_a_grandchild, limit=0.5)
    assert time.monotonic() - start < 5  # and the no_leaks fixture sees no survivor


def _library_calls():
    import torch.distributed as dist

    import minidist as md
    from minidist.parallel.data.buckets import assign_buckets

    sandbox.forbid([sandbox.COLLECTIVES, sandbox.BUCKETS, sandbox.SAMPLER])
    out = []
    for call in (lambda: md.all_reduce(None, torch.ones(1)), lambda: dist.all_reduce(None),
                 lambda: assign_buckets([], 1), lambda: md.DistributedSampler(None, None),
                 lambda: torch.utils.data.DistributedSampler(range(3), 1, 0)):
        try:
            call()
            out.append("allowed")
        except RuntimeError as e:
            out.append(str(e))
    return out


def test_forbidden_library_calls_raise_with_the_reason():
    got = run_in_child(_library_calls)
    assert all(sandbox.NOT_ALLOWED_TEXT in text for text in got), got
    assert "minidist.collectives.api.all_reduce" in got[0]
    assert "torch.distributed.all_reduce" in got[1]
    import minidist as md

    assert sandbox.unwrapped(md.all_reduce).__code__.co_name == "all_reduce"  # untouched here


def _refusal_of_a_library_function():
    import minidist as md

    sandbox.forbid([sandbox.COLLECTIVES])
    try:
        md.all_reduce(None, torch.ones(1))
    except Exception as e:  # the type is what is judged
        return {"type": type(e).__name__, "not_allowed": isinstance(e, sandbox.NotAllowed),
                "text": str(e)}
    return {"type": "none", "not_allowed": False, "text": "ran"}


def test_a_refused_library_function_raises_not_allowed():
    # its code is swapped for a refusal: that refusal is a NotAllowed too, as promised
    got = run_in_child(_refusal_of_a_library_function)
    assert got["not_allowed"], got
    assert "minidist.collectives.api.all_reduce is not allowed in this exercise" in got["text"]


def _data_parallel_rules_and_a_watched_all_reduce():
    import minidist as md
    from minidist.collectives import api

    sandbox.forbid([sandbox.DATA_PARALLEL, sandbox.PREDICT])
    out = []
    for call in (lambda: md.DistributedDataParallel(torch.nn.Linear(1, 1), None),
                 lambda: md.all_reduce_coalesced(None, [torch.ones(1)]),
                 lambda: md.Link(alpha=1e-6, bandwidth=1e9).time(8)):
        try:
            call()
            out.append("allowed")
        except RuntimeError as e:
            out.append(str(e))
    seen = []

    def around(original, comm, t, *args, **kwargs):
        seen.append(t.numel())
        return original(comm, t, *args, **kwargs)

    sandbox.observe(api.all_reduce, around)

    def rank(comm):  # a rank forked after observe: its md.all_reduce is watched too
        return md.all_reduce(comm, torch.ones(5)).tolist(), seen

    return out, md.launch(rank, 1)[0]


def test_data_parallel_rules_keep_md_all_reduce_and_it_can_be_watched():
    refused, (five, seen) = run_in_child(_data_parallel_rules_and_a_watched_all_reduce)
    assert all(sandbox.NOT_ALLOWED_TEXT in text for text in refused), refused
    assert "DistributedDataParallel" in refused[0] and "all_reduce_coalesced" in refused[1]
    assert "Link" in refused[2]
    assert five == [1.0] * 5 and seen == [5]
    from minidist.collectives import api

    assert "__minidist_grader_observed__" not in vars(api)  # this process is untouched


# -- a fresh child (issue 27): nothing of the grader's, and nothing it starts outlives it --
def _what_the_child_can_reach():
    import gc
    import inspect

    frames = [f.filename for f in inspect.stack()]
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.numel() == 7
             and bool((o == 271828.0).all())]
    return to_plain({"frames": frames, "found": len(found), "ppid": os.getppid()})


def test_a_fresh_child_holds_no_grader_frame_and_no_reference():
    # in this frame, as a check's oracle is: a forked child would find it with gc
    reference = torch.full((7,), 271828.0, dtype=torch.float64)
    got = run_in_child(_what_the_child_can_reach, fresh=True)
    assert not any("pytest" in f or "_pytest" in f for f in got["frames"]), got["frames"]
    assert got["found"] == 0 and reference.numel() == 7
    assert got["ppid"] != os.getpid()  # its parent is the fork server, not the grader


def _kills_its_parent():
    import signal

    os.kill(os.getppid(), signal.SIGKILL)
    return to_plain("still here")


def test_an_answer_that_kills_its_parent_does_not_end_the_grader():
    for _ in range(2):  # the fork server it killed is replaced for the next child
        assert run_in_child(_kills_its_parent, fresh=True) == "still here"
        assert run_in_child(_returns, ("next",), fresh=True) == "next"


def _double_forks(path):
    if os.fork() == 0:
        os.setsid()  # a session of its own: out of the child's group and session
        if os.fork() == 0:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)
        os._exit(0)
    time.sleep(60)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("fresh", [True, False])
def test_a_double_forked_grandchild_is_killed_at_the_limit(tmp_path, fresh):
    path = tmp_path / "pid"
    with pytest.raises(ChildTimeout):
        run_in_child(_double_forks, (str(path),), limit=2.0, fresh=fresh)
    pid = int(path.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _reads_the_library():
    import subprocess

    import minidist.collectives.hierarchical as h

    sandbox.close_library_sources()
    out = []
    for attempt in (lambda: open(h.__file__).read(),
                    lambda: open(h.__cached__, "rb").read(),
                    lambda: subprocess.run(["cat", h.__file__], capture_output=True)):
        try:
            attempt()
            out.append("read")
        except PermissionError as e:
            out.append(str(e))
    return out


def test_library_sources_are_closed_to_the_code_under_test():
    got = run_in_child(_reads_the_library, fresh=True)
    assert all(sandbox.NOT_ALLOWED_TEXT in text for text in got), got


def _shared_memory_original():
    from minidist.collectives import shared_memory

    sandbox.forbid([sandbox.COMM_EFFICIENCY])
    table = shared_memory.available.__globals__.get("__minidist_grader_observed__", {})
    return to_plain({"kept": "available" in table, "now": shared_memory.available(None, None)})


def test_a_switched_off_path_keeps_no_original_to_reach():
    assert run_in_child(_shared_memory_original, fresh=True) == {"kept": False, "now": False}


_STUCK = '''
import os
import time


def stuck(path):
    """Start a grandchild, write both pids, then spin: an answer stuck in a loop."""
    kid = os.fork()
    if kid == 0:
        time.sleep(120)
        os._exit(0)
    with open(path, "w") as f:
        f.write(f"{os.getpid()} {kid}")
    while True:
        pass
'''
_GRADER = ("import sys; from stuck_answer import stuck; "
           "from minidist.grading.engine.isolation import run_in_child; "
           "run_in_child(stuck, (sys.argv[1],), limit=120.0, fresh=True)")


def test_a_stuck_answer_ends_when_the_grader_is_killed_outright(tmp_path):
    """SIGKILL gives the grader no time to end the child's tree: the child sees its
    lifeline close, and ends every process it started, then itself."""
    import signal
    import subprocess
    import sys

    (tmp_path / "stuck_answer.py").write_text(_STUCK)
    path = tmp_path / "pids"
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    grader = subprocess.Popen([sys.executable, "-c", _GRADER, str(path)], env=env,
                              cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (path.exists() and len(path.read_text().split()) == 2):
            assert time.monotonic() < deadline and grader.poll() is None
            time.sleep(0.05)
        child, grandchild = map(int, path.read_text().split())
        assert _alive(child) and _alive(grandchild)
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        deadline = time.monotonic() + 10
        while (_alive(child) or _alive(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child) and not _alive(grandchild)
    finally:
        grader.kill()
        grader.wait()


def _creates_a_segment_and_hangs(path: str):
    from minidist.transports.shm_segment import Segment

    seg = Segment.create(2)  # named and guarded; its ranks would attach, then it unlinks
    with open(path, "w") as f:
        f.write(seg.name)
    time.sleep(600)  # killed here, before any rank attached: the name is still there


@pytest.mark.parametrize("fresh", [True, False])
def test_a_segment_named_when_the_limit_kills_its_creator_is_removed(tmp_path, fresh):
    """A test killed while its ranks start (a busy machine) has a segment's name in
    /dev/shm; the name's guard must outlive the kill and remove it (it ends with the pipe
    its creator held, not by the grader's hand)."""
    path = tmp_path / "name"
    with pytest.raises(ChildTimeout):
        run_in_child(_creates_a_segment_and_hangs, (str(path),), limit=3.0, fresh=fresh)
    shm = "/dev/shm/" + path.read_text().lstrip("/")
    deadline = time.monotonic() + 5
    while os.path.exists(shm) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = os.path.exists(shm)
    if leaked:
        os.unlink(shm)
    assert not leaked, f"{shm} outlived the test that created it"
