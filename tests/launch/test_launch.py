"""md.launch: results by rank, failures as one WorkerError, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import minidist as md


def test_results_in_rank_order_and_args():
    out = md.launch(lambda comm, a, b=0: (comm.rank, comm.world_size, a, b), 4, args=(7,),
                    kwargs={"b": 9})
    assert out == [(r, 4, 7, 9) for r in range(4)]


def test_world_size_one():
    assert md.launch(lambda comm: (comm.rank, comm.world_size), 1) == [(0, 1)]


def _raise_on_rank_two(comm):
    if comm.rank == 2:
        raise KeyError("the missing key")
    comm.recv(torch.empty(1), 2)  # would wait for the full timeout if not stopped


def test_rank_error_is_reported_and_others_stopped():
    t = time.perf_counter()
    with pytest.raises(md.WorkerError) as info:
        md.launch(_raise_on_rank_two, 4, timeout=60)
    assert time.perf_counter() - t < 20  # the others were stopped, not waited for
    err = info.value
    assert err.rank == 2 and err.exc_type == "KeyError"
    assert "rank 2 failed" in str(err) and "the missing key" in str(err)
    assert "_raise_on_rank_two" in err.remote_traceback  # the rank's own traceback


@pytest.mark.parametrize("how,words", [("exit", "exit code 3"), ("kill", "SIGKILL")])
def test_rank_that_dies_without_raising(how, words):
    def fn(comm):
        if comm.rank == 1:
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.recv(torch.empty(1), 1)

    with pytest.raises(md.WorkerError) as info:
        md.launch(fn, 3, timeout=60)
    assert info.value.rank == 1 and "died" in str(info.value) and words in str(info.value)


def test_unpicklable_result():
    with pytest.raises(md.WorkerError, match="cannot be sent back"):
        md.launch(lambda comm: (lambda: None) if False else _Unpicklable(), 1)


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("no pickling")


def test_threads_per_rank_under_fork():
    assert md.launch(lambda comm: torch.get_num_threads(), 3) == [1, 1, 1]
    with pytest.raises(ValueError, match="OpenMP"):
        md.launch(lambda comm: None, 2, threads=2)


def test_trace_returns_timelines():
    def fn(comm):
        with comm.timeline.span("compute"):
            comm.sendrecv(torch.ones(8), 1 - comm.rank, torch.empty(8), 1 - comm.rank)
        r = comm.irecv(torch.empty(2), 1 - comm.rank, tag=1)
        comm.isend(torch.ones(2), 1 - comm.rank, tag=1).wait()
        r.wait()
        return comm.rank

    out = md.launch(fn, 2, trace=True)
    assert out == [0, 1] and len(out.timelines) == 2
    names = {e["name"] for e in out.timelines[0]}
    assert {"compute", "sendrecv", "isend", "irecv"} <= names


def _run_script(code: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, **kw)


def test_spawn_with_function_defined_in_main():
    """What a notebook does: the function lives in __main__; spawn pickles it with dill."""
    proc = _run_script("""
        import torch, minidist as md
        def work(comm, k):
            return comm.rank * k, torch.get_num_threads()
        if __name__ == "__main__":
            print(md.launch(work, 2, args=(10,), start_method="spawn"))
    """)
    assert proc.returncode == 0, proc.stderr
    ncpu = os.cpu_count() or 1
    assert f"[(0, {max(1, ncpu // 2)}), (10, {max(1, ncpu // 2)})]" in proc.stdout


def test_no_hang_when_parent_used_openmp_before_fork():
    """Forking after the parent's OpenMP pool exists hangs children that use >1 thread;
    launch gives forked ranks one thread, so their parallel ops complete."""
    proc = _run_script("""
        import torch, minidist as md
        torch.set_num_threads(2)
        a = torch.randn(1500, 1500); (a @ a).sum(); torch.randn(5_000_000).add_(1)
        def work(comm):
            b = torch.randn(5_000_000); b.add_(1)
            c = torch.randn(500, 500)
            return float((c @ c).sum() * 0) + (b * 0).sum().item()
        print(md.launch(work, 2))
    """, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "[0.0, 0.0]" in proc.stdout


def test_interrupt_stops_all_ranks():
    """Ctrl-C (SIGINT) in the caller stops every rank and removes the segment."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time, minidist as md
        def work(comm):
            print("pid", os.getpid(), flush=True)
            time.sleep(300)
        try:
            md.launch(work, 3)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)], stdout=subprocess.PIPE, text=True)
    pids = []
    while len(pids) < 3:
        line = proc.stdout.readline()
        assert line, "the ranks never started"
        pids.append(int(line.split()[1]))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "interrupted" in out
    time.sleep(0.2)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"rank {pid} survived"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"md-{proc.pid}-")]


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_caller_killed_takes_ranks_down():
    """If the caller dies (a kernel restart), the ranks die with it (PR_SET_PDEATHSIG)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, time, minidist as md
        def work(comm):
            print("pid", os.getpid(), flush=True)
            time.sleep(300)
        md.launch(work, 2)
    """)], stdout=subprocess.PIPE, text=True)
    pids = [int(proc.stdout.readline().split()[1]) for _ in range(2)]
    time.sleep(0.3)  # the caller removes the segment's name once both ranks have mapped it
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
            os.path.exists(f"/proc/{p}") and not _is_zombie(p) for p in pids):
        time.sleep(0.05)
    assert all(not os.path.exists(f"/proc/{p}") or _is_zombie(p) for p in pids)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"md-{proc.pid}-")]


def _modules_imported_by_an_optimizer(comm):
    before = set(sys.modules)
    torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    return sorted(m for m in set(sys.modules) - before if m.startswith("torch._dynamo"))


def test_forked_ranks_find_torch_dynamo_already_imported():
    """Optimizers import torch._dynamo on first use (~1 s per rank); the caller imports it
    once before forking, so no rank pays for it again."""
    assert md.launch(_modules_imported_by_an_optimizer, 2) == [[], []]


def _sleep(comm):
    time.sleep(30)


def test_interrupting_a_launch_is_one_line():
    import threading

    from minidist.launch.processes import LaunchInterrupted

    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(LaunchInterrupted) as info:
        md.launch(_sleep, 3)
    assert info.value._render_traceback_() == ["interrupted: 3 ranks stopped"]
    assert isinstance(info.value, KeyboardInterrupt)
