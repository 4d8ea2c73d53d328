"""The grading pipeline: exercise generation, feedback, and the grader on notebooks that
edit their test cells, hang or crash."""

from __future__ import annotations

import json
import pathlib

import nbformat
import pytest
from nbformat import v4

from minidist.cli import main as cli_main
from minidist.grading import build
from minidist.grading.engine import compare, feedback
from minidist.grading.engine.data import contributors, pattern
from minidist.grading.notebook_grader import grade_notebook
from minidist.grading.registry import exercise_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOLUTION_00 = ROOT / "solutions" / "00_getting_started.ipynb"


# -- generating exercises ------------------------------------------------------------------
def test_stub_replaces_each_solution_region_and_names_the_function():
    src = ("def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n"
           "    ### END SOLUTION\n\nz = 2\n### BEGIN SOLUTION\nw = 3\n### END SOLUTION")
    assert build.stub_regions(src, code=True) == (
        "def f(x):\n    y = 1\n    # YOUR CODE HERE\n"
        '    raise NotImplementedError("f is not written yet")\n\nz = 2\n'
        "# YOUR CODE HERE\n"
        'raise NotImplementedError("f is not written yet")')
    assert build.stub_regions("Q?\n### BEGIN SOLUTION\nA.\n### END SOLUTION", code=False) \
        == "Q?\nYOUR ANSWER HERE"


@pytest.mark.parametrize("src", ["### BEGIN SOLUTION\nx", "x\n### END SOLUTION",
                                 "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION"])
def test_unbalanced_markers_are_an_error(src):
    with pytest.raises(ValueError, match="SOLUTION"):
        build.stub_regions(src, code=True)


def test_exercise_has_stubs_metadata_and_no_outputs():
    solution = nbformat.read(str(SOLUTION_00), as_version=4)
    exercise = build.make_exercise(solution)
    assert exercise.metadata["minidist"] == {"exercise": "00_getting_started"}
    assert "widgets" not in exercise.metadata
    for before, after in zip(solution.cells, exercise.cells):
        assert before.metadata.get("nbgrader") == after.metadata.get("nbgrader")
        assert build.BEGIN not in after.source
        if after.cell_type == "code":
            assert after.outputs == [] and after.execution_count is None
    graded = [c.metadata["nbgrader"] for c in exercise.cells if "nbgrader" in c.metadata]
    for meta in graded:  # nbgrader's schema
        assert {"grade", "solution", "locked", "grade_id", "schema_version"} <= set(meta)
        assert meta["schema_version"] == 3
        assert "points" in meta or not meta["grade"]


def test_committed_exercises_are_up_to_date_with_solutions():
    assert build.build(ROOT, check=True) == []


def test_metadata_check_finds_missing_and_wrong_tests():
    nb = nbformat.read(str(SOLUTION_00), as_version=4)
    test_cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    test_cells[0].metadata["nbgrader"]["points"] = 99
    nb.cells.remove(test_cells[1])
    problems = build.check_metadata(nb, "00_getting_started")
    assert any("99 points" in p for p in problems)
    assert any("no test cell for the stored test 'test_ping_pong'" in p for p in problems)


# -- feedback helpers ----------------------------------------------------------------------
def test_learner_frame_skips_library_frames():
    tb = ('Traceback (most recent call last):\n'
          '  File "/x/minidist/launch.py", line 145, in _worker\n    result = fn(comm)\n'
          '  File "/tmp/ipykernel_9/123.py", line 7, in ring\n    comm.recv(buf, left)\n'
          '  File "/x/minidist/comm.py", line 127, in recv\n    return self.irecv()\n')
    assert feedback.learner_frame(tb) == (7, "comm.recv(buf, left)", None)
    graded = tb.replace("/tmp/ipykernel_9/123.py", "<cell 4>")
    assert feedback.learner_frame(graded) == (7, "comm.recv(buf, left)", 4)
    assert feedback.learner_frame("no traceback") is None


def test_compare_names_rank_and_values():
    import torch

    got, want = torch.tensor([1.0, 2.0, 5.0]), torch.tensor([1.0, 2.0, 3.0])
    assert compare.compare(want.clone(), want, "rank 0") is None
    msg = compare.compare(got, want, "rank 2")
    assert msg.startswith("rank 2: 1 of 3 values wrong: [2] = 5 (expected 3)")
    assert "shape" in compare.compare(got[:2], want, "rank 1")
    assert compare.compare([1, 2, 3], want, "rank 0") is None  # a list of the right values
    assert compare.compare((1.0, 2.0, 5.0), want, "rank 0").startswith("rank 0: 1 of 3")
    assert "dtype" in compare.compare(want.double(), want, "rank 0")
    assert "returned None" in compare.compare(None, want, "rank 0")


def test_contributors_decode_which_ranks_were_summed():
    import torch

    p = 4
    data = [pattern(r, 6, torch.float64, p) for r in range(p)]
    partial = data[0] + data[2] + data[3]
    assert contributors(partial[5].item(), 5, p) == [0, 2, 3]
    assert contributors((data[1] * 2)[3].item(), 3, p) is None  # counted twice


# -- the grader on whole notebooks -----------------------------------------------------------
def _nb(*cells, name="00_getting_started"):
    nb = v4.new_notebook(cells=list(cells))
    nb.metadata["minidist"] = {"exercise": name}
    return nb


def _graded(gid, points, source):
    cell = v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                 "grade_id": gid, "points": points, "schema_version": 3}
    return cell


def _solution_sources() -> dict[str, str]:
    nb = nbformat.read(str(SOLUTION_00), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution") or
            c.metadata.get("nbgrader", {}).get("grade_id") == "setup"}


def test_exercise_is_known_by_metadata_or_file_name():
    assert exercise_of("x/ana_00_getting_started.ipynb") == "00_getting_started"
    assert exercise_of("mine.ipynb", {"minidist": {"exercise": "01_collectives"}}) \
        == "01_collectives"
    assert exercise_of("mine.ipynb") is None


def _write(tmp_path, nb, name="00_getting_started.ipynb") -> str:
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return str(path)


def _earned(report) -> dict[str, int]:
    return {r["grade_id"]: r["earned"] for r in report.results}


def test_editing_deleting_or_reordering_test_cells_changes_nothing(tmp_path, capsys):
    src = _solution_sources()
    wrong_shift = "def ring_shift(comm, t):\n    return t.clone()  # forgot to communicate"
    nb = _nb(_graded("test_fit_alpha_beta", 2, "check('test_fit_alpha_beta', fit_alpha_beta)"),
             v4.new_code_cell(src["setup"]), v4.new_code_cell(wrong_shift),
             _graded("test_ring_shift", 2, "print('passed, 2/2 points')"),  # edited
             v4.new_code_cell(src["ping_pong"]),  # its test cell deleted
             v4.new_code_cell(src["fit_alpha_beta"]))
    path = _write(tmp_path, nb, "ana_00_getting_started.ipynb")
    out_json = tmp_path / "grades.json"
    assert cli_main(["grade", path, "--json", str(out_json)]) == 0
    table = capsys.readouterr().out
    assert "total: 5 / 8 points" in table  # predict_transfer_time is not in this notebook
    result = json.loads(out_json.read_text())
    assert result["earned"] == 5 and result["points"] == 8
    tests = {t["grade_id"]: t for t in result["notebooks"][0]["tests"]}
    assert tests["test_ring_shift"]["earned"] == 0
    assert "rank 0: 1 of 1 values wrong" in tests["test_ring_shift"]["feedback"]
    assert tests["test_ping_pong"]["earned"] == 3 and tests["test_fit_alpha_beta"]["earned"] == 2


def test_a_hang_costs_only_the_tests_that_call_it(tmp_path):
    src = _solution_sources()
    looping_fit = src["fit_alpha_beta"].replace('"""Fit', 'while True:\n        pass\n    """Fit')
    nb = _nb(v4.new_code_cell(src["setup"]), v4.new_code_cell(src["ring_shift"]),
             v4.new_code_cell("time.sleep(600)  # a cell that waits forever: never run"),
             v4.new_code_cell(src["ping_pong"]), v4.new_code_cell(looping_fit))
    # 20 s, not 5: a busy CI machine once took longer than 5 s over ring_shift's cases
    report = grade_notebook(_write(tmp_path, nb), timeout=20,
                            only=["test_ring_shift", "test_ping_pong", "test_fit_alpha_beta"])
    assert _earned(report) == {"test_ring_shift": 2, "test_ping_pong": 3, "test_fit_alpha_beta": 0}
    assert "fit_alpha_beta did not return within 20 s" in report.results[2]["feedback"]


def test_a_rank_stuck_in_a_loop_is_named(tmp_path, monkeypatch):
    from minidist.grading.engine import learner

    monkeypatch.setattr(learner, "COMM_TIMEOUT", 1.0)
    src = _solution_sources()
    stuck = ("def ring_shift(comm, t):\n    while comm.rank == 0:\n        pass\n"
             "    comm.recv(t, 0)\n    return t\n")
    nb = _nb(v4.new_code_cell(src["setup"]), v4.new_code_cell(stuck))
    report = grade_notebook(_write(tmp_path, nb), timeout=4, only=["test_ring_shift"])
    text = report.results[0]["feedback"]
    assert text.startswith("with world_size=2, n=1, dtype=float32: ring_shift did not finish "
                           "within the test's 4 s: rank 0 was still running it"), text
    assert "rank 1 waited for a message" in text


def test_a_function_that_kills_its_process_scores_zero_alone(tmp_path):
    src = _solution_sources()
    fatal = "def fit_alpha_beta(sizes, seconds):\n    import os\n    os._exit(3)\n"
    nb = _nb(v4.new_code_cell(src["setup"]), v4.new_code_cell(src["ring_shift"]),
             v4.new_code_cell("import os\nos._exit(3)  # never run"), v4.new_code_cell(fatal))
    report = grade_notebook(_write(tmp_path, nb), only=["test_ring_shift", "test_fit_alpha_beta"])
    assert _earned(report) == {"test_ring_shift": 2, "test_fit_alpha_beta": 0}
    assert "ended without a result" in report.results[1]["feedback"]


def test_a_missing_function_or_a_broken_cell_is_named(tmp_path):
    src = _solution_sources()
    broken = src["fit_alpha_beta"].replace("return float(alpha)",
                                           "SCALE\n    return float(alpha)") + "\nSCALE = 1 / 0\n"
    nb = _nb(v4.new_code_cell(src["setup"]), v4.new_code_cell("def ring_shift(comm, t):\n  x ="),
             v4.new_code_cell(broken))
    report = grade_notebook(_write(tmp_path, nb))
    by_id = {r["grade_id"]: r["feedback"] for r in report.results}
    assert "cell 2 is not valid Python" in report.notes[0]
    assert by_id["test_ring_shift"].startswith("`ring_shift` is not defined in the notebook")
    assert "ZeroDivisionError" in by_id["test_fit_alpha_beta"]
    assert "at `SCALE = 1 / 0`" in by_id["test_fit_alpha_beta"]
    assert "of cell 3)" in by_id["test_fit_alpha_beta"]


@pytest.mark.slow
def test_execute_runs_the_notebook_for_notes_only(tmp_path):
    src = _solution_sources()
    nb = _nb(v4.new_code_cell(src["setup"]), v4.new_code_cell(src["fit_alpha_beta"]),
             v4.new_code_cell("raise ValueError('a demo cell that fails')"))
    report = grade_notebook(_write(tmp_path, nb), execute=True, only=["test_fit_alpha_beta"])
    assert "cell 3 raised ValueError: a demo cell that fails" in report.notes
    assert _earned(report) == {"test_fit_alpha_beta": 2}


def test_unreadable_or_unknown_notebooks_are_reported(tmp_path, capsys):
    bad = tmp_path / "00_getting_started.ipynb"
    bad.write_text("{not json")
    assert "cannot read the notebook" in grade_notebook(str(bad)).error
    other = _write(tmp_path, v4.new_notebook(), "notes.ipynb")
    assert "not a graded minidist exercise" in grade_notebook(other).error
    assert cli_main(["grade", other]) == 1
    assert "not graded" in capsys.readouterr().out
