"""``minidist bench faults``: kill a launch's caller at random moments and count leftovers.

The fault matrix of start-up: a caller (``md.launch`` of 4 ranks; with ``--scenarios``
also a nested launch and ``minidist run``) is killed with a random signal (SIGTERM, SIGKILL,
SIGHUP) at a random moment between its start and its normal end, over and over. After each
kill, whatever it started must be gone within seconds: no shared-memory segment
(``/dev/shm/md-*``), no process. A kill that leaves processes alive past ``--settle``
seconds is a hang. Not a timed test: a stress run, reported as a table (and ``--json``).

This process is the harness: it imports minidist once, makes itself a child subreaper (so a
killed caller's ranks become its children, to be watched and reaped, rather than init's),
and forks each caller from itself, so a kill costs milliseconds, not an interpreter start.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
import tempfile
import time
from contextlib import contextmanager

import torch

from .timing import add_common_arguments, format_table, save_outputs

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL, "SIGHUP": signal.SIGHUP}
_SUBREAPER = 36  # PR_SET_CHILD_SUBREAPER
_RANK_SCRIPT = "import minidist as md\ncomm = md.init()\ncomm.barrier()\n"


def _work(comm):
    import minidist as md

    md.all_reduce(comm, torch.ones(4))
    comm.barrier()
    return comm.rank


def _outer(comm):
    import minidist as md

    if comm.rank == 0:
        md.launch(_work, 2)
    comm.barrier()


def _caller(scenario: str, workdir: str) -> None:
    """The forked caller: one launch of ``scenario``; never returns."""
    code = 1
    try:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        import minidist as md

        if scenario == "launch":
            md.launch(_work, 4)
        elif scenario == "nested":
            md.launch(_outer, 2)
        else:
            from ..launch.script_runner import run

            code = run(2, [os.path.join(workdir, "rank.py")])
            raise SystemExit(code)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        code = 1
    finally:
        os._exit(code)


@contextmanager
def harness():
    """Make this process a child subreaper for the duration; reap everything after."""
    libc = ctypes.CDLL(None)
    libc.prctl(_SUBREAPER, 1)
    others = _descendants()  # this process's own helpers (a fork server...): not ours to end
    workdir = tempfile.mkdtemp(prefix="md-faults-")
    with open(os.path.join(workdir, "rank.py"), "w") as f:
        f.write(_RANK_SCRIPT)
    try:
        yield workdir
    finally:
        libc.prctl(_SUBREAPER, 0)
        _kill_all(_descendants() - others)
        os.remove(os.path.join(workdir, "rank.py"))
        os.rmdir(workdir)


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid: (parent pid, state) of every process we can see."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def _descendants() -> set[int]:
    """Live (not zombie) processes below this one."""
    table, found, frontier = _proc_table(), set(), {os.getpid()}
    while frontier:
        frontier = {p for p, (pp, _) in table.items() if pp in frontier} - found
        found |= frontier
    return {p for p in found if table[p][1] != "Z"}


def _reap() -> dict[int, int]:
    """Reap every child that has ended; pid: wait status."""
    done = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def _kill_all(pids: set[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while _descendants() & pids and time.monotonic() < deadline:
        _reap()
        time.sleep(0.01)
    _reap()


def _orphan_segments(before: set[str]) -> set[str]:
    """Segments that appeared since ``before`` whose creator is dead (or a zombie)."""
    table, out = _proc_table(), set()
    for name in set(os.listdir("/dev/shm")) - before:
        parts = name.split("-")
        if name.startswith("md-") and len(parts) > 2 and parts[1].isdigit():
            if table.get(int(parts[1]), (0, "Z"))[1] == "Z":
                out.add(name)
    return out


def trial(scenario: str, sig: int, delay: float, workdir: str, settle: float = 10.0) -> dict:
    """Fork a caller of ``scenario``, send it ``sig`` after ``delay`` seconds, and wait
    until it and all it started are gone. Call inside ``harness()``."""
    before, others = set(os.listdir("/dev/shm")), _descendants()
    pid = os.fork()
    if pid == 0:
        _caller(scenario, workdir)
    time.sleep(delay)
    finished = pid in _reap()
    if not finished:
        os.kill(pid, sig)
    killed_at = time.monotonic()
    while True:
        _reap()
        alive, shm = _descendants() - others, _orphan_segments(before)
        if not alive and not shm:
            break
        if time.monotonic() - killed_at > settle:
            _kill_all(alive)
            for name in _orphan_segments(before):
                os.remove(f"/dev/shm/{name}")
            break
        time.sleep(0.002)
    return {"scenario": scenario, "signal": signal.Signals(sig).name, "delay": delay,
            "finished": finished, "procs": len(alive), "segments": len(shm),
            "hung": bool(alive), "clean_s": time.monotonic() - killed_at}


def calibrate(scenario: str, workdir: str, runs: int = 3) -> float:
    """Seconds one unkilled caller of ``scenario`` takes, start to end: the median of
    ``runs`` after one warm-up run."""
    times = []
    for _ in range(runs + 1):
        t = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _caller(scenario, workdir)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code != 0:
            raise RuntimeError(f"an unkilled {scenario} caller failed (exit code {code})")
        times.append(time.monotonic() - t)
    return sorted(times[1:])[runs // 2]


def run_matrix(kills: int, scenarios: list[str], seed: int = 0, settle: float = 10.0,
               log=None) -> tuple[list[dict], dict[str, float]]:
    """``kills`` trials, each a random scenario, signal and moment within the caller's
    unkilled run time (measured first). Returns the trials and those run times."""
    rng, before = random.Random(seed), set(os.listdir("/dev/shm"))
    with harness() as workdir:
        spans = {s: calibrate(s, workdir) for s in scenarios}
        trials = []
        for i in range(kills):
            s, sig = rng.choice(scenarios), rng.choice(list(SIGNALS.values()))
            trials.append(trial(s, sig, rng.uniform(0, spans[s]), workdir, settle))
            if log is not None and (i + 1) % 50 == 0:
                log(f"{i + 1}/{kills} kills")
    late = _orphan_segments(before)  # left by a creator no trial saw die: none expected
    for name in late:
        os.remove(f"/dev/shm/{name}")
    if late:
        trials.append({"scenario": "(after all)", "signal": "-", "delay": 0.0,
                       "finished": False, "procs": 0, "segments": len(late), "hung": False,
                       "clean_s": 0.0})
    return trials, spans


def summarize(trials: list[dict]) -> list[dict]:
    """One row per (scenario, signal): kills, leftovers, hangs, time to clean."""
    rows = {}
    for t in trials:
        row = rows.setdefault((t["scenario"], t["signal"]), {
            "scenario": t["scenario"], "signal": t["signal"], "kills": 0, "finished": 0,
            "segments": 0, "procs": 0, "hangs": 0, "worst_ms": 0.0})
        row["kills"] += t["scenario"] != "(after all)"
        row["finished"] += t["finished"]
        row["segments"] += t["segments"]
        row["procs"] += t["procs"]
        row["hangs"] += t["hung"]
        row["worst_ms"] = max(row["worst_ms"], 1e3 * t["clean_s"])
    return [rows[k] for k in sorted(rows)]


def add_arguments(parser) -> None:
    add_common_arguments(parser, "50 kills instead of 1000", plot_help=None, rounds=False,
                         json_help="write the trials and table as JSON")
    parser.add_argument("--kills", type=int, help="how many callers to kill")
    parser.add_argument("--scenarios", default="launch",
                        help="comma-separated: launch (md.launch of 4 ranks), nested (a "
                             "launch inside a rank), run (minidist run -n 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds after a kill before leftovers count as a hang")


def main(args) -> None:
    if not sys.platform.startswith("linux"):
        raise SystemExit("minidist bench faults needs Linux (/dev/shm, /proc, subreapers)")
    kills = args.kills if args.kills is not None else (50 if args.quick else 1000)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in ("launch", "nested", "run")]
    if bad:
        raise SystemExit(f"unknown scenario {bad[0]!r}: choose launch, nested or run")
    t = time.monotonic()
    trials, spans = run_matrix(kills, scenarios, args.seed, args.settle,
                               log=lambda m: print(m, file=sys.stderr, flush=True))
    rows = summarize(trials)
    print(f"{kills} kills in {time.monotonic() - t:.0f} s; kill moments uniform in each "
          "caller's unkilled run time: " +
          ", ".join(f"{s} {1e3 * v:.0f} ms" for s, v in spans.items()))
    print(format_table(rows, [
        ("scenario", "scenario", "s"), ("signal", "signal", "s"), ("kills", "kills", "d"),
        ("finished", "done first", "d"), ("segments", "segments left", "d"),
        ("procs", "processes left", "d"), ("hangs", "hangs", "d"),
        ("worst_ms", "worst clean-up ms", ".0f")]))
    save_outputs(args, {"kills": kills, "spans_s": spans, "rows": rows, "trials": trials})
