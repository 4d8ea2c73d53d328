"""Turning what users pass (torch tensors, numpy arrays) into byte buffers the transports move.

Every transport moves raw bytes; the dtype travels as a small integer code in the message
header so that the receiver can check it (a float32 buffer must not silently receive int64).
"""

from __future__ import annotations

import numpy as np
import torch

# Codes are part of the wire format: append, never reorder.
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
)
DTYPE_CODE: dict[torch.dtype, int] = {dt: i for i, dt in enumerate(_DTYPES)}
CODE_DTYPE: dict[int, torch.dtype] = dict(enumerate(_DTYPES))

# The dtypes the collectives reduce (DESIGN.md section 3).
REDUCIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                    torch.int32, torch.int64)


def as_tensor(x, what: str) -> torch.Tensor:
    """Return ``x`` as a torch tensor sharing its memory; numpy arrays are accepted.

    ``what`` names the argument in error messages (e.g. ``"send buffer"``).
    """
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            raise TypeError(f"{what}: big-endian numpy arrays are not supported")
        try:
            t = torch.from_numpy(x)
        except TypeError as e:
            raise TypeError(f"{what}: numpy dtype {x.dtype} is not supported ({e})") from None
    else:
        raise TypeError(f"{what} must be a torch.Tensor or a numpy.ndarray, "
                        f"got {type(x).__name__}")
    if t.dtype not in DTYPE_CODE:
        raise TypeError(f"{what}: dtype {t.dtype} is not supported; "
                        f"use one of {', '.join(str(d) for d in _DTYPES)}")
    if not t.is_contiguous():
        raise ValueError(f"{what} is not contiguous (shape {tuple(t.shape)}, strides "
                         f"{t.stride()}); pass tensor.contiguous() instead")
    return t


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def dtype_name(code: int) -> str:
    dt = CODE_DTYPE.get(code)
    return str(dt).replace("torch.", "") if dt is not None else f"unknown dtype code {code}"
