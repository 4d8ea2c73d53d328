"""The naive split beside Megatron's: every linear column-parallel, every output gathered.

The obvious way to share a layer's work is to split each matrix multiply by its output
columns and all-gather the result, so that every layer sees a full input as in the
single-device model. For the MLP (h -> 4h -> h) that is two all-gathers forward (of the 4h
and the h activations) and, because both linears read a replicated input, two all-reduces of
the input gradients backward (of h and of 4h):

    naive:     (p-1)/p (4 + 1) bsh   +   2 (p-1)/p (1 + 4) bsh   = 15 (p-1)/p bsh elements
    Megatron:  2 (p-1)/p bsh (g, forward)  +  2 (p-1)/p bsh (f, backward) = 4 (p-1)/p bsh

per rank per step (ring algorithms; ``md.costmodel``'s ``tp.naive_mlp_bytes`` and
``tp.megatron_mlp_bytes``). Megatron's column-then-row pairing never materialises
the 4h activation anywhere whole: GELU is elementwise, so it runs on each rank's slice and
only the h-wide partial sums are added (Shoeybi et al. 2019, section 3). It also keeps the
4h activation at 1/p per rank, where the naive MLP holds it whole on every rank.
"""

from __future__ import annotations

import copy

from torch import nn

from .layers import ColumnParallelLinear


def gather_output_mlp(mlp: nn.Module, comm, algorithm: str = "auto") -> nn.Module:
    """A copy of nanoGPT's ``MLP`` (``c_fc``, ``gelu``, ``c_proj``) with both linears
    column-parallel and gathering their outputs: the naive layout."""
    if not all(hasattr(mlp, k) for k in ("c_fc", "gelu", "c_proj")):
        raise TypeError(f"gather_output_mlp: expected an md.models.gpt.MLP (c_fc, gelu, "
                        f"c_proj), got {type(mlp).__name__}")
    mlp = copy.deepcopy(mlp)  # the full MLP is left alone
    mlp.c_fc = ColumnParallelLinear.from_full(mlp.c_fc, comm, gather_output=True,
                                              algorithm=algorithm)
    mlp.c_proj = ColumnParallelLinear.from_full(mlp.c_proj, comm, gather_output=True,
                                                algorithm=algorithm)
    return mlp
