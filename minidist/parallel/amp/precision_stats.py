"""What 16 bits can hold: formats, underflow, vanished updates, bytes. Shared by the tests,
the benchmark and lesson 08.

                 sign  exponent  mantissa   max        smallest normal   eps (1 ulp at 1)
    float32       1      8         23       3.4e38     1.2e-38           1.2e-7
    float16       1      5         10       65504      6.1e-5            9.8e-4
    bfloat16      1      8          7       3.4e38     1.2e-38           7.8e-3

float16 (IEEE 754 half) trades range for precision: gradients below 2^-24 ~ 6e-8 round to
zero, hence loss scaling (Micikevicius et al. 2018). bfloat16 (Kalamkar et al. 2019) keeps
float32's exponent, so nothing underflows that float32 keeps, but with 8 bits of precision
``w + u == w`` whenever |u| < |w| * 2^-9: the master weights are what make small updates
count (``vanished_updates``).
"""

from __future__ import annotations

import torch

from ...costmodel.collectives import ring_bytes
from ..zero.flat_shards import storage_bytes

FORMATS = (torch.float32, torch.float16, torch.bfloat16)
__all__ = ["FORMATS", "format_table", "underflowed", "vanished_updates", "training_bytes",
           "all_reduce_bytes", "storage_bytes"]


def format_table() -> list[dict]:
    """One row per format: bits, largest value, smallest normal and subnormal, eps."""
    rows = []
    for dtype in FORMATS:
        info = torch.finfo(dtype)
        mantissa = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
        rows.append({"dtype": str(dtype).replace("torch.", ""), "bits": info.bits,
                     "exponent_bits": info.bits - 1 - mantissa, "mantissa_bits": mantissa,
                     "max": info.max, "smallest_normal": info.smallest_normal,
                     "smallest_subnormal": info.smallest_normal * info.eps, "eps": info.eps})
    return rows


def underflowed(grads: list[torch.Tensor] | torch.Tensor, dtype: torch.dtype,
                scale: float = 1.0) -> tuple[int, int]:
    """(how many nonzero values become 0 when ``value * scale`` is stored in ``dtype``, how
    many were nonzero). With float32 gradients from a reference run, the first number is
    what float16 training without loss scaling loses outright."""
    if isinstance(grads, torch.Tensor):
        grads = [grads]
    lost = nonzero = 0
    for g in grads:
        if g is None:
            continue
        g = g.detach().to(torch.float32)
        keep = g != 0
        lost += int((keep & ((g * scale).to(dtype) == 0)).sum())
        nonzero += int(keep.sum())
    return lost, nonzero


def vanished_updates(weights: torch.Tensor, updates: torch.Tensor, dtype: torch.dtype) -> float:
    """Fraction of nonzero ``updates`` that leave ``weights`` unchanged when both are held in
    ``dtype`` (``w + u`` rounds back to ``w``): the reason for float32 master weights."""
    w = weights.detach().to(dtype)
    u = updates.detach().to(dtype)
    moved = updates != 0
    if not bool(moved.any()):
        return 0.0
    same = (w + u) == w
    return float((same & moved).sum()) / float(moved.sum())


def training_bytes(n_params: int, dtype: torch.dtype, optimizer_bytes: int = 8,
                   master: bool = True) -> dict[str, int]:
    """Bytes of parameters, gradients, master weights and optimizer state at rest (the
    formula of ``master_weights.py``): float32 4 + 4 + K; 16-bit 2 + 2 + 4 (master) + K."""
    elem = torch.finfo(dtype).bits // 8
    half = dtype != torch.float32 and master
    out = {"params": elem * n_params, "grads": elem * n_params,
           "master": 4 * n_params if half else 0, "optimizer": optimizer_bytes * n_params}
    out["total"] = sum(out.values())
    return out


def all_reduce_bytes(numel: int, world_size: int, dtype: torch.dtype, rank: int = 0) -> int:
    """Bytes ``rank`` sends in a ring all_reduce of ``numel`` elements of ``dtype``:
    about 2 (p-1)/p x N x element size (``costmodel.collectives.ring_bytes``), so a 16-bit
    all_reduce sends half the bytes of a float32 one."""
    elem = torch.empty((), dtype=dtype).element_size()
    return ring_bytes(numel, elem, world_size, rank)
