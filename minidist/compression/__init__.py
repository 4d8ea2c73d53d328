"""Gradient compression for DDP: comm hooks that send fewer bytes (``ddp.register_comm_hook``).

* ``fp16_hook`` / ``bf16_hook`` (``casting_hooks.py``): all-reduce each bucket in 16 bits,
  half the bytes (torch's ``fp16_compress_hook``);
* ``TopK(ratio, error_feedback=True)`` (``topk.py``): each rank sends its k largest entries
  (indices and values, all-gathered) and keeps the rest as a residual for the next step;
  ``topk_naive`` beside it (sparsify, then a dense all_reduce: no byte saved);
* ``PowerSGD(rank=2)`` (``powersgd.py``): a rank-r approximation by one power-iteration
  step, (m + n) r elements per m x n gradient instead of m n (torch's ``powerSGD_hook``);
* ``hook_reports.py``: bytes sent and relative error per step (``hook.report()``), and
  ``Measured(hook)`` for any other hook;
* ``torch_hook(hook)`` (``torch_ddp.py``): any of these under torch's own DDP.
"""

from .casting_hooks import bf16_hook, cast_hook, fp16_hook
from .hook_reports import Measured, StepLog, dense_bytes
from .powersgd import PowerSGD, orthogonalize_, powersgd_bytes, powersgd_elements
from .topk import TopK, topk_bytes, topk_compress, topk_naive
from .torch_ddp import TorchBucket, torch_hook

__all__ = ["Measured", "PowerSGD", "StepLog", "TopK", "TorchBucket", "bf16_hook", "cast_hook",
           "dense_bytes", "fp16_hook", "orthogonalize_", "powersgd_bytes", "powersgd_elements",
           "topk_bytes", "topk_compress", "topk_naive", "torch_hook"]
