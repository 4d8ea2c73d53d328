"""``minidist grade NOTEBOOK... [--json PATH]``: score notebooks and print what to fix."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .engine.feedback import first_line
from .kernel import TEST_TIME_LIMIT

if TYPE_CHECKING:
    from .notebook_grader import Report

FEEDBACK_WIDTH = 100


def add_arguments(parser) -> None:
    parser.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="notebooks to grade")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--timeout", type=float, default=TEST_TIME_LIMIT,
                        help="seconds one test may take before it is stopped and scores "
                             f"zero (default {TEST_TIME_LIMIT:g})")
    parser.add_argument("--execute", action="store_true",
                        help="also run the notebook top to bottom in a fresh kernel and "
                             "note the cells that raise (never part of the score)")
    parser.add_argument("--cell-timeout", type=float, default=120.0,
                        help="with --execute: seconds one cell may run (default 120)")
    parser.add_argument("--full", action="store_true",
                        help="run at full size (default: quick mode, as CI)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the whole feedback of every failed test")


def main(args) -> int:
    try:
        from .notebook_grader import grade_notebook
    except ImportError as e:  # nbclient and nbformat come with the dev extra
        print(f"minidist grade needs Jupyter's nbclient ({e}); install it with "
              "pip install -e '.[dev]' or pip install nbclient ipykernel")
        return 2
    reports = []
    for path in args.notebooks:
        report = _grade_one(grade_notebook, path, args)
        print(format_report(report, verbose=args.verbose), end="\n\n", flush=True)
        reports.append(report)
    if len(reports) > 1:
        print(f"Total: {sum(r.earned for r in reports)} / {sum(r.points for r in reports)} "
              f"points in {len(reports)} notebooks")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"notebooks": [r.as_dict() for r in reports],
                       "earned": sum(r.earned for r in reports),
                       "points": sum(r.points for r in reports)}, f, indent=2)
    return 1 if any(r.error for r in reports) else 0


def _grade_one(grade_notebook, path, args) -> Report:
    """One notebook's report; a grading that crashed is reported as such, and the next
    notebook is still graded."""
    try:
        return grade_notebook(path, timeout=args.timeout, quick=not args.full,
                              execute=args.execute, cell_timeout=args.cell_timeout)
    except Exception as e:  # a bug of the grader's, or a machine fault: this notebook only
        from .notebook_grader import Report

        return Report(str(path), error=f"grading crashed ({type(e).__name__}: {e}); the "
                                       "other notebooks are graded on")


def format_report(report: Report, verbose: bool = False) -> str:
    """A table of one notebook's tests (id, points, earned, feedback) and its total."""
    title = f"{report.path}" + (f"  [{report.exercise}]" if report.exercise else "")
    if report.error:
        return f"{title}\n  not graded: {report.error}"
    rows = [("test", "points", "earned", "feedback")]
    for r in report.results:
        part = r.get("part", "core")
        gid = r["grade_id"] + ("" if part == "core" else f" ({part})")
        rows.append((gid, str(r["points"]), str(r["earned"]), _clip(first_line(r["feedback"]))))
    w = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [title]
    for k, (gid, pts, got, fb) in enumerate(rows):
        lines.append(f"  {gid.ljust(w[0])}  {pts.rjust(w[1])}  {got.rjust(w[2])}  {fb}")
        if k == 0:
            lines.append(f"  {'-' * w[0]}  {'-' * w[1]}  {'-' * w[2]}  {'-' * 8}")
    lines.append(f"  total: {report.earned} / {report.points} points")
    lines += [f"  note: {n}" for n in report.notes]
    if verbose:
        indent = "\n    "
        lines += [f"\n  {r['grade_id']}:{indent}{indent.join(r['feedback'].splitlines())}"
                  for r in report.results if not r["passed"]]
    return "\n".join(lines)


def _clip(text: str) -> str:
    return text if len(text) <= FEEDBACK_WIDTH else text[:FEEDBACK_WIDTH - 3] + "..."
