"""Reduction operators, the dtype rules behind them, and how 16-bit floats accumulate.

``op`` is one of ``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"prod"``. ``avg`` is a sum
followed by one division by the world size on every rank (every rank divides the same bits,
so every rank gets the same answer). The mean of integers is not an integer, so ``avg`` on an
integer tensor is an error rather than a silent floor division.

How float16 and bfloat16 accumulate (the same rule everywhere, stated once here):

* the data travel in their own dtype, so a float16 all_reduce moves half the bytes of a
  float32 one (which is why people use it) and the byte formulas hold for every dtype;
* every combine computes in float32 and rounds to float16/bfloat16 once. When a rank folds
  one received tensor into its partial result (ring, recursive halving/doubling) that is one
  rounding per hop, exactly what torch's own float16 ``a + b`` does. When a rank combines
  several tensors at once (the root of ``naive``, the inner nodes of ``tree``, the
  shared-memory path of ``auto``) it keeps a float32 accumulator across all of them and
  rounds once at the end, which is closer to the exact sum (``avg`` then divides the
  rounded sum, a second rounding; the shared-memory path divides the float32 accumulator
  before its one rounding);
* every element's final value is computed on exactly one rank and copied to the others, so
  the result is bitwise identical on every rank. Different algorithms round at different
  points, so two algorithms may differ in the last bit of a 16-bit result (as NCCL's ring and
  tree do), never two ranks.

Integer sums and products wrap around on overflow, as torch's integer arithmetic does.
"""

from __future__ import annotations

import torch

from ..comm.tensors import REDUCIBLE_DTYPES

OPS = ("sum", "avg", "max", "min", "prod")
HALF_DTYPES = (torch.float16, torch.bfloat16)


def check_op(op, dtype: torch.dtype, what: str) -> None:
    """Raise a clear error for an unknown op, a dtype that cannot be reduced, or int ``avg``."""
    if op not in OPS:
        raise ValueError(f"{what}: unknown op {op!r}; choose one of {', '.join(OPS)}")
    if dtype not in REDUCIBLE_DTYPES:
        names = ", ".join(_name(d) for d in REDUCIBLE_DTYPES)
        raise TypeError(f"{what}: cannot reduce {_name(dtype)} tensors; reductions support "
                        f"{names}")
    if op == "avg" and not dtype.is_floating_point:
        raise TypeError(f"{what}: op='avg' of {_name(dtype)} tensors is not defined (the mean "
                        "of integers is not an integer); convert to a floating dtype first, "
                        "or use op='sum' and divide")


def combine(a: torch.Tensor, b: torch.Tensor, op: str, out: torch.Tensor) -> torch.Tensor:
    """``out = a (op) b`` elementwise; ``out`` may be ``a`` or ``b``. ``avg`` sums here and
    divides once in :func:`finish_`. 16-bit floats are computed in float32 by torch."""
    if op in ("sum", "avg"):
        return torch.add(a, b, out=out)
    if op == "prod":
        return torch.mul(a, b, out=out)
    if op == "max":
        return torch.maximum(a, b, out=out)
    return torch.minimum(a, b, out=out)


def accumulator(x: torch.Tensor) -> torch.Tensor:
    """A private running result that starts as a copy of ``x``: float32 for 16-bit floats
    (rounded once by :func:`round_into`), the dtype itself otherwise."""
    return x.to(torch.float32) if x.dtype in HALF_DTYPES else x.clone()


def round_into(dst: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Copy an accumulator into ``dst`` (the single rounding step for 16-bit floats)."""
    if acc.data_ptr() != dst.data_ptr():
        dst.copy_(acc)
    return dst


def finish_(x: torch.Tensor, op: str, world_size: int) -> torch.Tensor:
    """Turn a final sum into an average; nothing to do for the other ops."""
    if op == "avg" and world_size > 1:
        x.div_(world_size)
    return x


def reduce_all(parts: list[torch.Tensor], op: str, out: torch.Tensor) -> torch.Tensor:
    """``out = parts[0] op parts[1] op ...`` with one float32 accumulator for 16-bit floats,
    rounded once. Used where one rank sees every input at once. ``avg`` stays a sum, as on
    every path: the caller divides (``finish_``)."""
    if out.dtype in HALF_DTYPES:
        acc = parts[0].to(torch.float32)
    else:
        acc = out if out.data_ptr() == parts[0].data_ptr() else out.copy_(parts[0])
    for part in parts[1:]:
        combine(acc, part, op, out=acc)
    return round_into(out, acc)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
