"""Phrases the feedback of exercise 05's checks shares (``tensor_parallel.py``,
``tp_shards.py``, ``tp_loss.py``): how a tensor, a number or a list of collective calls
reads in a sentence, and the grader's closeness test (float64, tight: the learner's layer
must equal the full one to rounding)."""

from __future__ import annotations

import torch

from ..engine.feedback import values


def close(a, b) -> bool:
    """Both tensors, same shape, equal to float64 rounding."""
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
        a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-9, atol=1e-12)


def describe(g) -> str:
    """A returned value in a sentence: shape and first values of a tensor, else its repr."""
    if isinstance(g, torch.Tensor):
        return f"{tuple(g.shape)} {values(g, 4)}"
    return repr(g)[:80]


def grad_text(grad) -> str:
    """A gradient's values, or None (autograd gave it none)."""
    return values(grad) if isinstance(grad, torch.Tensor) else "None"


def number(t) -> str:
    """A one-element tensor as a number, else its values."""
    if isinstance(t, torch.Tensor) and t.numel() == 1:
        return f"{t.item():.6g}"
    return grad_text(t)


def collective_names(calls: list) -> str:
    """``md.all_reduce of 48 elements, ...`` for calls recorded by ``tp_probe.Calls``."""
    return ", ".join(f"md.{c['name']} of {c['numel']} elements" for c in calls) or "none"
