"""The one comparison of a learner's tensor with the grader's: closeness within a declared
:class:`Tolerance`, and what differs when it is not close.

Every exercise states how close is right for it (float64 to rounding where the learner's
arithmetic is the oracle's in another order, looser where it runs in float32) by naming a
tolerance here or declaring its own; the comparison itself is the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .feedback import a_value, num, values


@dataclass(frozen=True)
class Tolerance:
    """``|got - want| <= atol + rtol * |want|``, element by element, computed in ``dtype``
    (None: in the tensors' own dtype, for float32 answers judged as float32 arithmetic)."""

    rtol: float
    atol: float
    dtype: torch.dtype | None = torch.float64


LOOSE = Tolerance(1e-5, 1e-6)  # a value the learner may compute in float32
FLOAT64 = Tolerance(1e-9, 1e-12)  # float64 to rounding: the same sums in another order
EXACT = Tolerance(0.0, 0.0)  # integers, or values every rank must agree on bit for bit


def isclose(got: torch.Tensor, want: torch.Tensor, tol: Tolerance = FLOAT64) -> torch.Tensor:
    """Element by element: is ``got`` within ``tol`` of ``want``."""
    if tol.dtype is not None:
        got, want = got.to(tol.dtype), want.to(tol.dtype)
    return torch.isclose(got, want, rtol=tol.rtol, atol=tol.atol)


def close(got, want, tol: Tolerance = FLOAT64) -> bool:
    """``got`` is a tensor of ``want``'s shape within ``tol`` of it everywhere."""
    return isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and \
        got.shape == want.shape and bool(isclose(got, want, tol).all())


def as_tensor(got, like: torch.Tensor):
    """``got`` as a tensor like ``like`` if it holds numbers (a list, a tuple, a number, a
    tensor of another dtype: the same answer in another container); else ``got``."""
    if isinstance(got, torch.Tensor) or got is None or isinstance(got, (str, dict)):
        return got
    try:
        return torch.as_tensor(got, dtype=like.dtype)
    except (TypeError, ValueError, RuntimeError):
        return got


def compare(got, expected, who: str, tol: Tolerance = LOOSE) -> str | None:
    """None if ``got`` equals ``expected`` within ``tol`` (shape, values; a list or tuple of
    the right numbers counts as the tensor); else what differs, naming ``who``."""
    if isinstance(got, torch.Tensor) and got.dtype != expected.dtype:
        return f"{who} has dtype {got.dtype}, expected {expected.dtype}"
    got = as_tensor(got, expected)
    if not isinstance(got, torch.Tensor):
        return f"{who} returned {a_value(got)}, expected a tensor"
    if got.shape != expected.shape:
        return (f"{who} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}: "
                f"got {values(got)}")
    near = isclose(got, expected, tol)
    if bool(near.all()):
        return None
    wrong = (~near).flatten().nonzero().flatten().tolist()
    shown = ", ".join(f"[{i}] = {num(got.flatten()[i].item())} (expected "
                      f"{num(expected.flatten()[i].item())})" for i in wrong[:3])
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    return f"{who}: {len(wrong)} of {got.numel()} values wrong: {shown}{more}"
