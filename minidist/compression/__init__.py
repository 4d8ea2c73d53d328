"""Gradient compression for DDP: comm hooks that send fewer bytes (``ddp.register_comm_hook``).

``fp16_hook`` / ``bf16_hook`` (``casting_hooks.py``): all-reduce each bucket in 16 bits, half
the bytes (torch's ``fp16_compress_hook``)."""

from .casting_hooks import bf16_hook, cast_hook, fp16_hook

__all__ = ["bf16_hook", "cast_hook", "fp16_hook"]
