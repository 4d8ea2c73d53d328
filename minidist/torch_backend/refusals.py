"""What the backend refuses before it queues anything, in words that name the call.

torch hands a backend tensors it has checked only loosely (gloo and NCCL check the rest in
C++). minidist moves the dtypes in ``comm/tensors.py`` and reduces those in
``REDUCIBLE_DTYPES``; CPU tensors travel as they are, CUDA tensors are staged through host
memory by the Communicator (as the local backend does everywhere).
"""

from __future__ import annotations

import torch

from ..comm.tensors import DTYPE_CODE, REDUCIBLE_DTYPES


def _names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensors(call: str, tensors, reduce: bool = False) -> None:
    """Every tensor on a device minidist moves, of a dtype it carries (and reduces, for a
    reduction)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"minidist backend: {call}: expected tensors, got "
                            f"{type(t).__name__}")
        if t.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"minidist backend: {call}: a CUDA tensor, but torch sees no "
                               "CUDA GPU in this process")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"minidist backend: {call}: a tensor on {t.device.type!r}; "
                             "minidist moves CPU tensors, and CUDA tensors through host "
                             "memory")
        if t.dtype not in DTYPE_CODE:
            raise TypeError(f"minidist backend: {call}: dtype "
                            f"{str(t.dtype).replace('torch.', '')} is not one minidist "
                            f"carries ({_names(DTYPE_CODE)})")
        if reduce and t.dtype not in REDUCIBLE_DTYPES:
            raise TypeError(f"minidist backend: {call}: cannot reduce "
                            f"{str(t.dtype).replace('torch.', '')} tensors; minidist "
                            f"reduces {_names(REDUCIBLE_DTYPES)}")


def check_same(call: str, tensors, what: str = "dtype") -> None:
    """All tensors share one dtype (torch's collectives require it)."""
    kinds = {getattr(t, what) for t in tensors}
    if len(kinds) > 1:
        raise TypeError(f"minidist backend: {call}: the tensors must share one {what}, got "
                        f"{', '.join(sorted(str(k).replace('torch.', '') for k in kinds))}")


def check_count(call: str, items, n: int, what: str) -> None:
    if len(items) != n:
        raise ValueError(f"minidist backend: {call}: expected {n} {what}, got {len(items)}")


def check_single(call: str, tensors) -> None:
    """torch passes a list of one tensor per process (several only for the old
    multi-device-per-process mode, which torch has dropped)."""
    if len(tensors) != 1:
        raise ValueError(f"minidist backend: {call}: one tensor per process, got "
                         f"{len(tensors)}")


def check_numel(call: str, output, want: int, what: str) -> None:
    if output.numel() != want:
        raise ValueError(f"minidist backend: {call}: the {what} has {output.numel()} "
                         f"elements, expected {want}")
