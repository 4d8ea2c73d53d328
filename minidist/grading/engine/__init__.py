"""The grader's engine: what every exercise's tests run on. Nothing here knows an exercise.

- ``spec``: what an exercise declares (``Exercise``, ``GradedTest``).
- ``learner``, ``isolation``, ``program``, ``sandbox``: the learner's code runs only in child
  processes (forked, time-limited, plain data back as JSON), loaded from the notebook's
  cells, with the library's and torch's version of what the exercise builds out of reach
  (``sandbox_rules``: what each rule refuses, and why).
- ``harness``: what runs on each rank of a test, and what a run that did not finish says.
- ``feedback``: ``Mistake`` and the phrases feedback is made of; ``compare``: the one
  comparison of tensors, within a declared ``Tolerance``; ``diagnose``: a wrong answer
  named by the known mistake (a declared row) that produces it; ``data``: test data whose
  sums say which ranks contributed.
"""
