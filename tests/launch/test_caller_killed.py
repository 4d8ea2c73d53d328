"""Nothing outlives a launch whose caller is killed at any moment of start-up (issue 10,
item 3): no /dev/shm segment, no process, for ``md.launch``, a launch nested in a rank and
``minidist run``. The harness of ``minidist bench faults`` forks each caller from this
process (a child subreaper meanwhile, so the orphaned ranks are ours to watch and reap) and
kills it at fixed delays: before the segment exists, while ranks start and attach, while
``minidist run``'s ranks import torch, while they run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from minidist.bench import faults

SIGNALS = [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP]
DELAYS = {"launch": [0.0, 0.001, 0.003, 0.006, 0.012, 0.025, 0.05],
          "nested": [0.0, 0.01, 0.03, 0.06, 0.12],
          "run": [0.0, 0.005, 0.05, 0.5, 2.0]}


@pytest.mark.parametrize("scenario", ["launch", "nested", "run"])
def test_killed_caller_leaves_nothing(scenario):
    with faults.harness() as workdir:
        trials = [faults.trial(scenario, sig, delay, workdir, settle=10.0)
                  for delay in DELAYS[scenario] for sig in SIGNALS]
    bad = [t for t in trials if t["segments"] or t["procs"] or t["hung"]]
    assert not bad, bad


INTERRUPTED_KERNEL = textwrap.dedent("""
    import json, os, signal, threading, time, torch, minidist as md

    def work(comm):
        md.all_reduce(comm, torch.ones(4))
        time.sleep(0.1)
        return comm.rank

    def interrupt_twice():  # what two quick Ctrl-C / "interrupt kernel" clicks send
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    def children():  # zombies included
        out = []
        for e in os.listdir("/proc"):
            try:
                with open(f"/proc/{e}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        out.append(int(e))
            except (OSError, ValueError):
                pass
        return out

    md.launch(work, 4)  # warm up, then count what a launch may hold
    fds = len(os.listdir("/proc/self/fd"))
    for delay in [0.0, 0.001, 0.002, 0.004, 0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08]:
        timer, step = threading.Timer(delay, interrupt_twice), 0
        while step < 3:  # an interrupt may land anywhere; go on from the step it cut
            try:
                step += 1
                if step == 1:
                    timer.start()
                elif step == 2:
                    try:
                        md.launch(work, 4)
                    except KeyboardInterrupt:
                        pass
                else:
                    time.sleep(0.1)  # the second interrupt may land after the launch
                    timer.join()
            except KeyboardInterrupt:
                step -= step == 3
    segs = [n for n in os.listdir("/dev/shm") if n.startswith(f"md-{os.getpid()}-")]
    print(json.dumps({"children": children(), "segments": segs, "fds_before": fds,
                      "fds_after": len(os.listdir("/proc/self/fd"))}))
""")


def test_two_quick_interrupts_in_a_kernel_leave_nothing():
    """The caller survives (a notebook kernel): after two SIGINTs 20 ms apart at any moment
    of a launch, it holds no rank (not even a zombie), no segment and no extra fd."""
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_KERNEL], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["children"] == [] and got["segments"] == [], got
    assert got["fds_after"] <= got["fds_before"], got
