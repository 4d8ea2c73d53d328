"""Graded notebooks: the authoritative tests, the autograder and the exercise generator.

- ``kernel``: ``checker`` for a notebook's test cells (``check("test_x", x)``: instant
  feedback, never a grade); the notebooks import it from here.
- ``notebook_grader``/``grade``: ``minidist grade NOTEBOOK...`` (``grade_notebook``);
  ``notebook_run`` runs a notebook in a kernel (``--execute`` notes, ``build --execute``).
- ``build``: ``python -m minidist.grading.build`` writes ``exercises/`` from ``solutions/``.
- ``registry``: every exercise's tests (``stored_tests``), found in ``exercises/``.
- ``exercises/``: one package per notebook: its tests, what runs on its ranks, its known
  mistakes and feedback (``exercises/__init__.py``).
- ``engine/``: what every exercise's tests run on: the learner's code in child processes
  under the sandbox's rules, the harness on each rank, feedback, comparison, diagnosis.
"""
