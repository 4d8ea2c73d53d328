"""What the grader takes from a notebook: the cells that define what a test needs."""

from __future__ import annotations

import traceback

import pytest

from minidist.grading.engine.program import Program

CELLS = [
    (1, "import time\nimport numpy as np\nimport matplotlib.pyplot as plt\nimport torch\n"
        "from minidist.grading.kernel import checker\ncheck = checker('00_getting_started')"),
    (2, "SCALE = 2\n\ndef helper(x):\n    return x * SCALE\n\n"
        "def ring_shift(comm, t):\n    return helper(torch.as_tensor(t))"),
    (3, "one_way = [slow_benchmark(n) for n in range(100)]\nplt.plot(one_way)\n"
        "%timeit ring_shift(None, 1)"),
    (4, "def fit_alpha_beta(sizes, seconds):\n    return np.polyfit(sizes, seconds, 1)"),
    (5, "def ring_shift(comm, t):  # redefined later: the later one counts\n"
        "    return helper(t) + 1"),
]


def test_selects_what_a_function_needs_and_nothing_else():
    program = Program.from_cells(CELLS)
    chosen = [(s.cell, type(s.node).__name__) for s in program.select(["ring_shift"])]
    assert chosen == [(1, "Import"), (2, "Assign"), (2, "FunctionDef"), (2, "FunctionDef"),
                      (5, "FunctionDef")]
    assert [s.cell for s in program.select(["fit_alpha_beta"])] == [1, 4]
    assert program.defines("ring_shift") and not program.defines("ping_pong")


def test_load_runs_the_selection_in_a_fresh_namespace():
    program = Program.from_cells(CELLS)
    namespace = program.load(["ring_shift"])
    assert namespace["ring_shift"](None, 3) == 7  # cell 5's version: 3 * 2 + 1
    assert "one_way" not in namespace and "check" not in namespace and "plt" not in namespace


def test_magics_are_translated_and_syntax_errors_noted():
    program = Program.from_cells([(1, "%matplotlib inline\nX = 1"), (2, "def f(:\n  pass"),
                                  (3, "!echo hi\ndef g():\n    return X")])
    assert program.notes == ["cell 2 is not valid Python (line 1: invalid syntax); the "
                             "grader skipped it"]
    assert program.load(["g"])["g"]() == 1


def test_tracebacks_name_the_cell_and_show_its_line():
    program = Program.from_cells([(7, "def f():\n    return 1 / 0")])
    f = program.load(["f"])["f"]
    with pytest.raises(ZeroDivisionError):
        try:
            f()
        except ZeroDivisionError:
            text = traceback.format_exc()
            raise
    assert 'File "<cell 7>", line 2, in f\n    return 1 / 0' in text


def test_star_imports_and_class_bodies():
    program = Program.from_cells([(1, "from math import *"), (2, "K = 3"),
                                  (3, "class Ring:\n    k = K\n"),
                                  (4, "def make():\n    return Ring.k + floor(pi)")])
    assert program.load(["make"])["make"]() == 6
