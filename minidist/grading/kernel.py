"""The test cells' ``check``: instant feedback inside the notebook. It never grades.

A notebook's test cell reads ``check("test_ping_pong", ping_pong)``: it runs the stored test
on the kernel's function and prints a verdict, raising ``Mistake`` on failure (so nbgrader,
which only looks for an exception, scores it too). The learner's function runs only in
child processes forked from the kernel, under the same rules and time limit as in the
grader; but the grade comes from ``minidist grade``, which loads the notebook's code from
the file into processes of its own, so nothing a kernel does (a patched module, an IPython
hook, a printed verdict) reaches it.
"""

from __future__ import annotations

from .engine.feedback import Mistake
from .engine.learner import Learner
from .engine.spec import GradedTest
from .registry import stored_tests

TEST_TIME_LIMIT = 120.0  # seconds one test may take in all, in a notebook or the grader


def evaluate(test: GradedTest, learner: Learner) -> dict:
    """Run ``test`` (in this process; the learner's code in children); the result as a
    JSON-ready dict."""
    learner.rules = test.rules
    learner.start()
    try:
        note = test.check(learner)
        passed, feedback = True, note or "all checks passed"
    except Mistake as e:
        passed, feedback = False, str(e)
    except Exception as e:  # a bug in the test, or learner data it did not expect
        passed, feedback = False, (f"the test could not judge the result ({type(e).__name__}: "
                                   f"{e}); tell the instructor")
    return {"grade_id": test.grade_id, "points": test.points, "part": test.part,
            "earned": test.points if passed else 0, "passed": passed, "feedback": feedback}


def checker(exercise: str, limit: float = TEST_TIME_LIMIT):
    """``check = checker("00_getting_started")``; then ``check("test_x", x)`` in test cells."""
    tests = stored_tests(exercise)

    def check(grade_id: str, *objects) -> None:
        if grade_id not in tests:
            raise KeyError(f"{exercise} has no test {grade_id!r}; tests: {list(tests)}")
        test = tests[grade_id]
        if len(objects) != len(test.needs):
            raise TypeError(f"check({grade_id!r}, ...) takes {', '.join(test.needs)}")
        objects_by_name = dict(zip(test.needs, objects))
        learner = Learner(test.needs, lambda: dict(objects_by_name), limit=limit, quiet=False)
        result = evaluate(test, learner)
        if not result["passed"]:
            raise Mistake(result["feedback"])
        print(verdict(result))

    return check


def verdict(result: dict) -> str:
    score = (f"{result['earned']}/{result['points']} points" if result["points"]
             else "practice, no points")
    state = "passed" if result["passed"] else "FAILED"
    return f"{result['grade_id']}: {state}, {score}: {result['feedback']}"
