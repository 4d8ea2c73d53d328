"""Mixed precision: float16/bfloat16 training with float32 master weights and dynamic loss
scaling agreed across ranks (Micikevicius et al., "Mixed Precision Training", ICLR 2018;
torch.amp; NVIDIA Apex O2; DeepSpeed's fp16 optimizer; bfloat16: Kalamkar et al. 2019).

* ``GradScaler`` (``grad_scaler.py``, ``md.GradScaler``): torch.amp.GradScaler's schedule;
  ``comm=`` all-reduces found_inf (max) so every rank skips the same steps
  (``inf_agreement.py``); ``loss_scaling=False`` keeps the check and the agreement without
  scaling (bfloat16: a NaN on one rank skips the step on every rank).
* ``MasterWeightOptimizer`` / ``MixedPrecision`` (``master_weights.py``): 16-bit model,
  float32 master copy in the optimizer, update in float32 and rounded back; composes with
  ``md.DistributedDataParallel`` (16-bit buckets: half the bytes) and ``md.ZeRO`` (sharded
  master weights).
* ``precision_stats.py``: format ranges, underflow and vanished-update counts, byte formulas.
* 16-bit communication for float32 models: ``md.compression.fp16_hook`` / ``bf16_hook``.

On CPU, float16 arithmetic is emulated through float32 on most x86 cores (no float16 units;
bfloat16 has AVX512-BF16 on some): expect 16-bit steps to be *slower* than float32 here, and
the win to be bytes (memory, communication); ``minidist bench amp`` measures both.
"""

from .grad_scaler import GradScaler, next_scale, unscale_and_check
from .inf_agreement import agree_found_inf, agreement_cost, communicators
from .master_weights import MasterWeightOptimizer, MixedPrecision
from .precision_stats import (
    all_reduce_bytes,
    format_table,
    training_bytes,
    underflowed,
    vanished_updates,
)

__all__ = ["GradScaler", "MasterWeightOptimizer", "MixedPrecision", "agree_found_inf",
           "agreement_cost", "all_reduce_bytes", "communicators", "format_table", "next_scale",
           "training_bytes", "underflowed", "unscale_and_check", "vanished_updates"]
