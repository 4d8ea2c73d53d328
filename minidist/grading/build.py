"""Write the student notebooks (``exercises/``) from the solved ones (``solutions/``).

``solutions/NN_name.ipynb`` is the single source, in nbgrader's "source" form: solution code
sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, and each graded cell carries
nbgrader metadata. The exercise is the same notebook with every such region replaced by a
stub that fails fast, and with no outputs.

    python -m minidist.grading.build            # write exercises/ from solutions/
    python -m minidist.grading.build --check    # exit 1 if exercises/ is out of date
    python -m minidist.grading.build --execute  # first re-run lessons/ and solutions/ in
                                                # place (fresh kernel) to refresh outputs
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import re
import sys

import nbformat

from .registry import EXERCISES, stored_tests

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", 'raise NotImplementedError("{name} is not written yet")')
MARKDOWN_STUB = "YOUR ANSWER HERE"
KEEP_METADATA = ("kernelspec", "language_info", "minidist")


def stub_regions(source: str, code: bool) -> str:
    """``source`` with every solution region replaced by the stub."""
    out, inside, name = [], False, None
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN!r} in:\n{source}")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            if code:
                name = _enclosing_function(out) or "this code"
                out += [indent + s.format(name=name) for s in CODE_STUB]
            else:
                out.append(indent + MARKDOWN_STUB)
        elif stripped == END:
            if not inside:
                raise ValueError(f"{END!r} without {BEGIN!r} in:\n{source}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN!r} without {END!r} in:\n{source}")
    return "\n".join(out)


def _enclosing_function(lines: list[str]) -> str | None:
    for line in reversed(lines):
        m = re.match(r"\s*def\s+(\w+)", line)
        if m:
            return m.group(1)
    return None


def make_exercise(solution) -> nbformat.NotebookNode:
    """The student notebook for a solved one: stubs instead of solutions, no outputs."""
    nb = copy.deepcopy(solution)
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_METADATA}
    for cell in nb.cells:
        if BEGIN in cell.source:
            cell.source = stub_regions(cell.source, cell.cell_type == "code")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    return nb


def check_metadata(nb, exercise: str) -> list[str]:
    """Problems with the nbgrader metadata of a solved notebook, against the stored tests."""
    tests, problems, seen = stored_tests(exercise), [], {}
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        if BEGIN in cell.source and not (meta and meta.get("solution")):
            problems.append(f"cell {i + 1} has a solution region but no nbgrader solution "
                            "metadata")
        if not meta:
            continue
        gid = meta.get("grade_id")
        if gid in seen:
            problems.append(f"grade_id {gid!r} is used by cells {seen[gid]} and {i + 1}")
        seen[gid] = i + 1
        if meta.get("grade") and not meta.get("solution"):
            test = tests.get(gid)
            if test is None:
                problems.append(f"cell {i + 1}: no stored test for grade_id {gid!r}")
            elif meta.get("points") != test.points:
                problems.append(f"cell {i + 1}: {gid} gives {meta.get('points')} points, "
                                f"the stored test {test.points}")
    problems += [f"no test cell for the stored test {gid!r}" for gid in tests if gid not in seen]
    return problems


def execute_in_place(path: pathlib.Path, timeout: float = 600.0) -> None:
    """Run a notebook top to bottom in a fresh kernel and save it with its outputs."""
    from nbclient import NotebookClient

    from .notebook_run import current_env_kernel

    nb = nbformat.read(str(path), as_version=4)
    NotebookClient(nb, km=current_env_kernel(), timeout=timeout, record_timing=False,
                   extra_arguments=["--IPKernelApp.log_level=ERROR"],
                   resources={"metadata": {"path": str(path.parent)}}).execute(cleanup_kc=True)
    nbformat.write(nb, str(path))


def build(root: pathlib.Path, check: bool = False) -> list[str]:
    """Write (or with ``check``, compare) every exercise; return the problems found."""
    problems = []
    for name in EXERCISES:
        src = root / "solutions" / f"{name}.ipynb"
        if not src.exists():
            continue
        solution = nbformat.read(str(src), as_version=4)
        problems += [f"{src}: {p}" for p in check_metadata(solution, name)]
        exercise, dst = make_exercise(solution), root / "exercises" / f"{name}.ipynb"
        if check:
            if not dst.exists() or nbformat.read(str(dst), as_version=4) != exercise:
                problems.append(f"{dst} is out of date with {src}: run "
                                "python -m minidist.grading.build")
        else:
            nbformat.write(exercise, str(dst))
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minidist.grading.build",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=".", help="the repository (default: here)")
    p.add_argument("--check", action="store_true", help="only check that exercises/ is current")
    p.add_argument("--execute", nargs="*", metavar="NOTEBOOK",
                   help="re-run these notebooks (default: all of lessons/ and solutions/) "
                        "in place first")
    args = p.parse_args(argv)
    root = pathlib.Path(args.root)
    if args.execute is not None:
        paths = [pathlib.Path(x) for x in args.execute] or sorted(
            [*root.glob("lessons/*.ipynb"), *root.glob("solutions/*.ipynb")])
        for path in paths:
            print(f"executing {path}", flush=True)
            execute_in_place(path)
    problems = build(root, check=args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
