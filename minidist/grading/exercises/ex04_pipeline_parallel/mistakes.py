"""Exercise 04's known mistakes and hints: the micro-batches' losses weighted another way
than the batch's mean (declared by their weights), and the send that blocks when
neighbours send to each other."""

from __future__ import annotations

import torch

from ...engine.compare import close
from ...engine.diagnose import diagnose

SEND_HINT = (
    "\nIn a pipeline, neighbours send to each other: stage r sends activations to r + 1 while "
    "r + 1 sends gradients to r. With comm.send (which returns only once the message is "
    "received) both can wait in their sends at once. Send with comm.isend, append the "
    "request to pending and return: the step waits for every request at its end.")


def scale_hint(got, p: int, n: int, m: int, oracle) -> str:
    """A hint if ``got`` (the returned loss, or every stage's results) is that of another
    weighting of the micro-batches' losses; ``oracle(p, n, m, weights)`` replays one."""
    sizes = [len(b) for b in torch.arange(n).tensor_split(m)]
    why = (f"each micro-batch's loss is a mean over its own samples (here {sizes} samples), "
           "so weight micro-batch i's loss by its share of the batch, n_i / n, to get the "
           "batch's mean loss")
    known = [  # (the micro-batches' weights in the loss, hint)
        ([1.0] * m, f". That is what the sum of the micro-batches' losses gives; {why}"),
        ([1.0 / m] * m, f". That is what each micro-batch's loss weighted 1/m gives; {why}"),
    ]
    return diagnose(known, got, lambda weights: oracle(p, n, m, weights), same=_same) or ""


def _same(got, want: list[dict]) -> bool:
    if isinstance(got, float):
        return abs(got - want[-1]["loss"]) <= 1e-9 * max(1.0, abs(got))
    return all(close(got[r]["grads"].get(k), g) for r in range(len(want))
               for k, g in want[r]["grads"].items())
