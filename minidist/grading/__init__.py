"""Graded notebooks: the authoritative tests, the autograder and the exercise generator.

- ``registry``: which tests each exercise has (``grade_id``, points, what they need).
- ``checks/``: the tests themselves, one module per notebook, with feedback that names
  the mistake (``feedback``).
- ``kernel``: what runs inside a notebook's kernel (``check`` in test cells; ``run_test``
  for the grader).
- ``runner``/``grade``: ``minidist grade NOTEBOOK...``.
- ``build``: ``python -m minidist.grading.build`` writes ``exercises/`` from ``solutions/``.
"""
