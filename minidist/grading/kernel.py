"""What runs inside the notebook's kernel: ``check`` for test cells, ``run_test`` for the grader.

A notebook's test cell reads ``check("test_ping_pong", ping_pong)``: it runs the stored test
and prints a verdict, raising ``Mistake`` on failure (so nbgrader, which only looks for an
exception, scores it too). The grader instead injects ``run_test(exercise, grade_id,
globals())``, which takes the objects the test needs from the kernel's namespace and reports
the result as display data of type :data:`MIME` for the grader to read.
"""

from __future__ import annotations

from .feedback import Mistake, describe_exception
from .registry import GradedTest, stored_tests

MIME = "application/vnd.minidist.grade+json"


def evaluate(test: GradedTest, objects: list) -> dict:
    """Run ``test`` on the learner's objects; return the result as a JSON-ready dict."""
    try:
        note = test.check(*objects)
        passed, feedback = True, note or "all checks passed"
    except Exception as e:  # the learner's code may raise anything
        passed, feedback = False, describe_exception(e, test.needs[0] if test.needs else "")
    return {"grade_id": test.grade_id, "points": test.points,
            "earned": test.points if passed else 0, "passed": passed, "feedback": feedback}


def run_test(exercise: str, grade_id: str, namespace: dict) -> dict:
    """The grader's call: run the stored test with objects from ``namespace``; display it."""
    from IPython.display import display

    test = stored_tests(exercise)[grade_id]
    missing = [n for n in test.needs if n not in namespace]
    if missing:
        result = {"grade_id": grade_id, "points": test.points, "earned": 0, "passed": False,
                  "feedback": f"`{missing[0]}` is not defined: run or restore the cell that "
                              "defines it (and keep its name)."}
    else:
        result = evaluate(test, [namespace[n] for n in test.needs])
    display({MIME: result, "text/plain": _verdict(result)}, raw=True)
    return result


def checker(exercise: str):
    """``check = checker("00_getting_started")``; then ``check("test_x", x)`` in test cells."""
    tests = stored_tests(exercise)

    def check(grade_id: str, *objects) -> None:
        if grade_id not in tests:
            raise KeyError(f"{exercise} has no test {grade_id!r}; tests: {list(tests)}")
        result = evaluate(tests[grade_id], list(objects))
        if not result["passed"]:
            raise Mistake(result["feedback"])
        print(_verdict(result))

    return check


def _verdict(result: dict) -> str:
    score = f"{result['earned']}/{result['points']} points"
    verdict = "passed" if result["passed"] else "FAILED"
    return f"{result['grade_id']}: {verdict}, {score}: {result['feedback']}"
