"""One package per graded exercise, each named after its notebook (``ex03_parameter_server``
grades ``03_parameter_server.ipynb``) and holding all of its grading:

- ``__init__.py``: ``EXERCISE``, the exercise's graded tests in notebook order (grade_id,
  points, what each takes from the notebook, its sandbox rules, core or stretch): the
  registry finds it there;
- ``checks.py``: the tests, run in the grader's process on plain data (exercise 04, the
  largest, splits them into ``schedule.py`` and ``stages.py``);
- ``ranks.py``: what runs on the ranks (case functions, probes) and the test data and
  oracles both sides rebuild;
- ``mistakes.py``: the exercise's known mistakes as ``(reference variant, hint)`` rows for
  ``engine.diagnose``, and the other hints its feedback gives.

A test of an exercise is changed, or tightened, in that exercise's folder only.
"""
