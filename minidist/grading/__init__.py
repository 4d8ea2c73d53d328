"""Graded notebooks: the authoritative tests, the autograder and the exercise generator.

- ``registry``: which tests each exercise has (``grade_id``, points, rules, core or stretch).
- ``checks/``: the tests themselves, one module per notebook; they run in the grader's
  process and judge plain data, with feedback that names the mistake (``feedback``).
- ``learner``, ``isolation``, ``program``, ``sandbox``: the learner's code runs only in child
  processes (forked, time-limited, plain data back as JSON), loaded from the notebook's
  cells, with the library's and torch's version of what the exercise builds out of reach.
- ``kernel``: ``check`` for a notebook's test cells (instant feedback, never a grade).
- ``notebook_grader``/``grade``: ``minidist grade NOTEBOOK...``; ``notebook_run`` runs a
  notebook in a kernel (``--execute`` notes, ``build --execute``).
- ``build``: ``python -m minidist.grading.build`` writes ``exercises/`` from ``solutions/``.
"""
