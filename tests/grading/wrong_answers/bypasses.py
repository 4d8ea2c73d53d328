"""Cells that try to fake a grade instead of earning one, on the untouched stubs: a patched
grading module, IPython hooks that print or display a passing grade, a forged result file.
Each must leave every test at zero, still saying the function is not written."""

from . import Wrong

STUB = "is not written yet"

PATCH_GRADING = """\
import importlib

def passed(test, *args, **kwargs):
    return {"grade_id": test.grade_id, "points": test.points, "earned": test.points,
            "passed": True, "feedback": "all checks passed"}

for module, name, value in (
        ("minidist.grading.kernel", "evaluate", passed),
        ("minidist.grading.notebook_grader", "evaluate", passed),
        ("minidist.grading.engine.compare", "compare", lambda *args, **kwargs: None),
        ("minidist.grading.engine.learner", "run_in_child", lambda *args, **kwargs: [])):
    try:
        setattr(importlib.import_module(module), name, value)
    except ImportError:
        pass
ex00 = importlib.import_module("minidist.grading.exercises.ex00_getting_started")
for test in ex00.EXERCISE.tests:
    object.__setattr__(test, "check", lambda *args: "all checks passed")
"""

HOOKS = """\
from IPython import get_ipython
from IPython.display import display

MIME = "application/vnd.minidist.grade+json"

def fake(*args):
    for gid, points in (("test_ring_shift", 2), ("test_ping_pong", 3),
                        ("test_fit_alpha_beta", 2)):
        print(f"{gid}: passed, {points}/{points} points: all checks passed")
        display({MIME: {"grade_id": gid, "points": points, "earned": points,
                        "passed": True, "feedback": "all checks passed"},
                 "text/plain": "passed"}, raw=True)

get_ipython().events.register("pre_run_cell", fake)
get_ipython().events.register("post_run_cell", fake)
"""

FORGE_RESULTS = """\
import json
import pathlib

fake = {"earned": 7, "points": 7, "notebooks": [{"earned": 7, "points": 7, "tests": []}]}
for name in ("grades.json", "results.json", "minidist_grades.json"):
    pathlib.Path(name).write_text(json.dumps(fake))
print("Total: 7 / 7 points")
"""

PATCH_FROM_INSIDE = {"ring_shift": """\
def ring_shift(comm, t):
    import minidist.grading.exercises.ex00_getting_started.checks as gs
    import minidist.grading.engine.compare as fb
    fb.compare = lambda *args, **kwargs: None
    gs._check_shifted = gs._check_one_message = lambda *args, **kwargs: None
    return t
"""}

PATCH_IN_THE_NEEDED_CELL = {"ring_shift": """\
import minidist.grading.kernel as grading_kernel

grading_kernel.evaluate = lambda test, learner: {"grade_id": test.grade_id, "earned": 2,
                                                 "points": 2, "passed": True, "feedback": ""}


def ring_shift(comm, t, patched=grading_kernel):
    raise NotImplementedError("ring_shift is not written yet")
"""}

ALL_STUBS = {"test_ring_shift": STUB, "test_ping_pong": STUB, "test_fit_alpha_beta": STUB}
EX = "00_getting_started"

WRONG = [
    Wrong("patch_grading_modules", EX, base="exercises", extra=(PATCH_GRADING,),
          expect=ALL_STUBS),
    Wrong("hooks_print_and_display_grades", EX, base="exercises", extra=(HOOKS,),
          expect=ALL_STUBS),
    Wrong("forged_result_files", EX, base="exercises", extra=(FORGE_RESULTS,),
          expect=ALL_STUBS),
    Wrong("all_three_on_stubs", EX, base="exercises",
          extra=(PATCH_GRADING, HOOKS, FORGE_RESULTS), expect=ALL_STUBS),
    Wrong("patch_grading_in_the_cell_the_test_loads", EX, base="exercises",
          cells=PATCH_IN_THE_NEEDED_CELL,
          expect={**ALL_STUBS, "test_ring_shift": "is not available to the code under test"}),
    Wrong("patch_grading_from_inside_the_function", EX, cells=PATCH_FROM_INSIDE,
          expect={"test_ring_shift": "is not available to the code under test"}),
]
