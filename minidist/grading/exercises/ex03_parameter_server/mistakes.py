"""Exercise 03's known mistakes: wrong admission rules (each declared by what it answers),
and what a server's wrong parameters are in terms of the pushes it got: a missed push, a
division by the number of workers (or of ranks), the sum for the average, a mix of this
step's gradients."""

from __future__ import annotations

import operator

import torch

from ...engine.compare import Tolerance, close
from ...engine.diagnose import diagnose

WEIGHTS = Tolerance(1e-5, 1e-8)  # the least-squares weights of the gradients in an update


def times(n) -> str:
    n = int(n) if float(n).is_integer() else n
    return "once" if n == 1 else f"{n:g} times"


# -- the admission rule ------------------------------------------------------------------------
WRONG_RULES = [  # (a typical wrong rule, what to say when the answers are all its answers)
    (lambda c, cs, s: c - min(cs) < s,
     "the bound is inclusive: a worker exactly s steps ahead may go, c - min(clocks) <= s "
     "(with < and s = 0 nobody ever moves, not even the slowest)"),
    (lambda c, cs, s: c - min(cs) <= s + 1,
     "c - min(clocks) <= s + 1 admits a worker s + 1 steps ahead, one more than the bound"),
    (lambda c, cs, s: max(cs) - c <= s,
     "this measures how far a worker is behind the fastest; the rule bounds how far it is "
     "ahead of the slowest: c - min(clocks) <= s"),
    (lambda c, cs, s: c - max(cs) <= s,
     "compare with min(clocks), the slowest worker: every worker is at most 0 steps ahead of "
     "the fastest, so comparing with max(clocks) admits everyone"),
]


def admit_hint(case, got: bool, answers: list[bool], cases) -> str:
    hint = diagnose(WRONG_RULES, answers, lambda rule: [rule(*c) for c in cases],
                    same=operator.eq)
    if hint:
        return hint
    clock, clocks, s = case
    lead = clock - min(clocks)
    if got and lead == s + 1:
        return (f"this admits a worker {s + 1} steps ahead of the slowest, one more than the "
                f"bound s = {s}. A worker at clock c may go only if c - min(clocks) <= s; "
                "with s = 0 every worker waits for the slowest: that is the synchronous step")
    if got:
        return (f"this worker is {lead} steps ahead of the slowest (clock {min(clocks)}), more "
                f"than s = {s}: compare with min(clocks), the slowest worker, whoever it is")
    if lead == s:
        return (f"this holds back a worker exactly s = {s} steps ahead; the bound is "
                "inclusive: c - min(clocks) <= s may go")
    if clock == min(clocks):
        return ("the slowest worker must always go: it is the one the others wait for, and "
                "if it is held nobody moves again")
    return (f"this worker is {lead} step(s) ahead of the slowest (clock {min(clocks)}), "
            f"within s = {s}: c - min(clocks) <= s may go")


# -- the parameters a server sent back -----------------------------------------------------------
def sync_hint(got, start, grads, lr, tol: Tolerance) -> str:
    """What the parameters sent back (``got``, flat float64) are, in terms of this step's
    gradients."""
    n = grads.shape[0]
    if close(got, start, tol):
        return "they are the parameters before the update: update first, then reply"
    weights = torch.linalg.lstsq(grads.T, (start - got) / lr).solution
    if not close(start - lr * (grads.T @ weights), got, tol):
        err = (got - (start - lr * grads.mean(0))).abs().max().item()
        return (f"they differ from params - lr * (the average of the {n} gradients) by up to "
                f"{err:.3g}, and are not params - lr * (any mix of this step's gradients)")
    if close(weights, torch.full((n,), 1.0 / (n + 1), dtype=weights.dtype), WEIGHTS):
        return (f"the gradients were averaged over world_size = {n + 1}, but only the {n} "
                "workers (ranks 1 and up) push one; rank 0 is the server: divide by "
                "world_size - 1")
    if n > 1 and close(weights, torch.ones(n, dtype=weights.dtype), WEIGHTS):
        return (f"they hold the sum of the {n} gradients, {n} times the average: divide by "
                "the number of workers")
    counts = ", ".join(f"worker {w + 1}'s gradient {times(round(c * n, 3))}" for w, c in
                       enumerate(weights.tolist()))
    return (f"over the {n} workers, the update counts {counts}; expected each worker's "
            "gradient once (did one receive buffer overwrite another, or a gradient come in "
            "twice?)")


def ssp_mistakes(got, start, expected, pushes, tol: Tolerance, gradient=None) -> str | None:
    """The known mistake an SSP server's reply (``got``, flat float64) shows, given the
    initial parameters, the parameters every push so far makes (``expected``) and
    ``pushes``: (the (worker, step) of every push applied so far, the number of workers,
    ``without(w, k)``: the parameters with that one push left out); ``gradient(w, k)``, if
    given, is that push's gradient (a reply of a gradient instead of the parameters)."""
    applied, workers, without = pushes
    total = start - expected
    known = [(lambda w=w, k=k: without(w, k),
              f"they miss the gradient worker {w} pushed at step {k + 1}: apply each push "
              "(params -= lr * grad) as soon as it arrives, before replying")
             for w, k in applied]
    known += [(lambda n=n: start - total / n,
               f"each push was divided by {n}: in asynchronous training there is no step to "
               "average over; apply each push alone, params -= lr * grad")
              for n in {workers, workers + 1}]
    known.append((lambda: start + total,
                  "each push was added: the update goes against the gradient, "
                  "params -= lr * grad"))
    if gradient is not None:
        known += [(lambda w=w, k=k: gradient(w, k),
                   f"that is the gradient worker {w} pushed at step {k + 1}, not the "
                   "parameters: reply with params (after the update)")
                  for w, k in applied]
    return diagnose(known, got, tol=tol)
