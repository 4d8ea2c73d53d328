"""16-bit gradient communication as a DDP comm hook: cast, all-reduce, cast back.

torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` (torch.distributed.algorithms.
ddp_comm_hooks.default_hooks): a float32 bucket is divided by p, rounded to float16 (or
bfloat16), summed over the ranks in 16 bits, and copied back into the float32 buffer. The
bytes on the wire halve (ring: 2 (p-1)/p x N x 2 instead of x 4); the sum itself is computed
in float32 and rounded once per combine (``collectives/ops.py``), so the only extra error is
rounding each rank's contribution and each partial sum to 16 bits, relative 2^-11 (float16)
or 2^-8 (bfloat16) per rounding. Dividing by p *before* the cast keeps a float16 sum of p
contributions inside float16's range (65504). A float16 cast of a gradient below 6e-8 gives
0 and of one above 65504 gives inf: fine for loss-scaled gradients, a risk otherwise.

For a model already in 16 bits (``md.parallel.amp.MixedPrecision``) DDP's buckets are 16-bit
and its default average already communicates 16 bits; these hooks are for float32 models
(autocast training), where they save the same half of the bytes.

    ddp.register_comm_hook(md.compression.fp16_hook)
"""

from __future__ import annotations

import torch

from ..collectives import all_reduce


def cast_hook(dtype: torch.dtype):
    """A comm hook that all-reduces each bucket in ``dtype`` (float16 or bfloat16)."""
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"cast_hook: dtype must be torch.float16 or torch.bfloat16, got "
                         f"{dtype!r}")

    def hook(comm, bucket) -> torch.Tensor:
        buffer = bucket.buffer
        low = buffer.div(comm.world_size).to(dtype)  # divide first: the sum stays in range
        all_reduce(comm, low, op="sum")
        return buffer.copy_(low)

    hook.__name__ = hook.__qualname__ = f"{str(dtype).replace('torch.', '')}_hook"
    return hook


fp16_hook = cast_hook(torch.float16)
bf16_hook = cast_hook(torch.bfloat16)
