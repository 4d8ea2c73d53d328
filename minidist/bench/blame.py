"""``minidist bench blame``: who does ``md.launch`` blame, run after run?

When one rank fails, the others fail too, as a consequence (a receive from a rank that has
left, a connection reset by peer), and their reports can reach the caller in the same
instant as the cause's. The caller must name the rank that caused it every time, not the
first report it happens to read. This bench repeats each way of leaving (a rank raises, returns
early, exits, is killed, returns while the others still receive from it) ``--runs`` times on
each backend and counts the runs that blamed the right rank with the right words. With
``--busy`` the caller also reads its ranks only every 0.2 s, as on a loaded machine, so every
report is waiting at once: the race that used to blame a survivor one run in six.

Not a timed test: a stress run, reported as a table (and ``--json``).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from contextlib import contextmanager

import torch

from .timing import add_common_arguments, format_table, save_outputs

# how rank 2 leaves: the words the blame must contain
SCENARIOS = {"raise": "KeyError: 'the missing key'", "return": "returned from its function",
             "exit": "exit code 0", "kill": "SIGKILL", "recv": "returned from its function"}
BLAMED = 2


def _leave(comm, how: str):
    """Rank 2 leaves as ``how`` says after one all_reduce; the others go on needing it."""
    import minidist as md

    x = torch.ones(8)
    md.all_reduce(comm, x)
    if comm.rank == BLAMED:
        if how == "raise":
            raise KeyError("the missing key")
        if how == "exit":
            os._exit(0)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return "early"
    if how in ("raise", "recv"):
        comm.recv(torch.empty(1), BLAMED)
    for _ in range(3):
        md.all_reduce(comm, x)
    return "done"


@contextmanager
def busy_caller(period: float):
    """The caller looks at its ranks only every ``period`` seconds (0: as it does)."""
    watch = importlib.import_module("minidist.launch.watch")  # md.launch is the function
    real = watch.wait_any

    def slow(objects, timeout=None):
        time.sleep(period)
        return real(objects, timeout=timeout)

    if period > 0:
        watch.wait_any = slow
    try:
        yield
    finally:
        watch.wait_any = real


def trial(how: str, backend: str, world_size: int = 4) -> tuple[bool, str]:
    """One launch; (blamed right, the blame's first line)."""
    import minidist as md

    try:
        md.launch(_leave, world_size, args=(how,), backend=backend, timeout=30)
    except md.WorkerError as e:
        first = str(e).splitlines()[0]
        return e.rank == BLAMED and SCENARIOS[how] in first, first[:200]
    return False, "no error was raised"


def run_cells(runs: int, backends: list[str], scenarios: list[str], busy: float,
              log=None) -> list[dict]:
    """``runs`` trials of every (backend, scenario) cell, interleaved run by run."""
    rows = {(b, s): {"backend": b, "scenario": s, "runs": 0, "right": 0, "wrong": []}
            for b in backends for s in scenarios}
    with busy_caller(busy):
        for i in range(runs):
            for (b, s), row in rows.items():
                ok, line = trial(s, b)
                row["runs"] += 1
                row["right"] += ok
                if not ok:
                    row["wrong"].append(line)
            if log is not None and (i + 1) % 20 == 0:
                log(f"{i + 1}/{runs} rounds")
    return list(rows.values())


def add_arguments(parser) -> None:
    add_common_arguments(parser, "10 runs a cell instead of 200", plot_help=None, rounds=False,
                         json_help="write the cells (and every wrong blame) as JSON")
    parser.add_argument("--runs", type=int, help="launches per cell")
    parser.add_argument("--backends", default="local,torch", help="comma-separated")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated: " + ", ".join(SCENARIOS))
    parser.add_argument("--busy", type=float, default=0.0, metavar="SECONDS",
                        help="the caller reads its ranks only this often (0.2 shows the race)")


def main(args) -> None:
    runs = args.runs if args.runs is not None else (10 if args.quick else 200)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in SCENARIOS] + [
        b for b in backends if b not in ("local", "torch")]
    if bad:
        raise SystemExit(f"unknown scenario or backend {bad[0]!r}: scenarios are "
                         f"{', '.join(SCENARIOS)}; backends local, torch")
    t = time.monotonic()
    rows = run_cells(runs, backends, scenarios, args.busy,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    polling = f"every {args.busy:.2f} s" if args.busy else "as it does"
    print(f"{runs} launches a cell in {time.monotonic() - t:.0f} s; rank {BLAMED} of 4 leaves; "
          f"caller polling {polling}")
    for row in rows:
        row["wrong_n"] = row["runs"] - row["right"]
    print(format_table(rows, [("backend", "backend", "s"), ("scenario", "rank 2 ...", "s"),
                              ("runs", "runs", "d"), ("right", "blamed rank 2", "d"),
                              ("wrong_n", "blamed another", "d")]))
    for row in rows:
        for line in row["wrong"][:3]:
            print(f"  {row['backend']}/{row['scenario']}: {line}")
    save_outputs(args, {"runs": runs, "busy_s": args.busy, "rows": rows})
