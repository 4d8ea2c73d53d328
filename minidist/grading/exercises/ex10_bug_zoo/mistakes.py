"""Exercise 10's hints: what a rank's wrong gradients are (a multiple of the average, its own
gradient), a sample order shortened for a sentence, and what a misplaced ZeRO update is
(a padding zero, an element that did not move, one moved by another's gradient)."""

from __future__ import annotations

import torch

from .ranks import ZERO_LR as LR
from .ranks import close as _close
from .ranks import local_grads


def average_hint(g, w, p: int, r: int) -> str:
    if not isinstance(g, torch.Tensor) or g.shape != w.shape:
        return "keep each .grad a tensor of its parameter's shape"
    ratio = float((g * w).sum() / (w * w).sum())
    if _close(g, ratio * w, 1e-6):
        if abs(ratio - p) < 1e-6:
            return (f"they are {p}x the average (the sum over the ranks), so every SGD step "
                    f"is {p}x too large and the run trains as if lr were {p}x larger: divide "
                    "the summed gradients by comm.world_size")
        return (f"they are {ratio:.4g}x the average over the {p} ranks: divide the sum by "
                "comm.world_size, once")
    local = local_grads(0, r)
    if any(_close(g, x) for x in local):
        return "they are this rank's own gradients: sum them over the ranks first"
    if any(_close(g, x / p) for x in local):
        return (f"they are this rank's own gradients divided by {p}: the sum never reached "
                "this rank (md.reduce leaves it on dst only): all-reduce, so that every rank "
                "gets the sum, then divide")
    return "all-reduce each gradient with op=\"sum\" and divide by comm.world_size"


def short(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 8 else str(xs[:8])[:-1] + ", ...]"


def zero_why(x, i: int, start, grad, p: int = 1) -> str:
    v = float(x[i])
    if v == 0.0:
        return "a padding zero; "
    if abs(v - float(start[i])) < 1e-12:
        return "it did not move; "
    if p > 1 and abs(v - (float(start[i]) - LR * p * float(grad[i]))) < 1e-12:
        return (f"it moved by {p}x the mean gradient: the sum over the ranks, reduce-scatter "
                'with op="avg"; ')
    n = len(start)
    for j, k in [(j, k) for j in range(n) for k in range(n) if (j, k) != (i, i)]:
        if abs(v - (float(start[j]) - LR * float(grad[k]))) < 1e-12:
            who = "it" if j == i else f"parameter {j}"
            by = "its own gradient" if k == j else f"parameter {k}'s gradient"
            return f"{who} moved by {by}; "
    return ""


def indices(ix: list[int]) -> str:
    return ", ".join(map(str, ix[:-1])) + f" and {ix[-1]}" if len(ix) > 1 else str(ix[0])
