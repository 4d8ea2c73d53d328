"""How fast the emulated cluster's devices compute: ``md.Compute``, and counting FLOPs.

Under ``md.launch(..., network=net, clock="virtual")`` a rank's computation between two
communication calls is charged to its virtual clock (``clock.py``). Without a model it is
the thread's own CPU time; with ``md.Network.uniform(link, compute=md.Compute(...))`` it is
the floating-point operations torch ran in that interval divided by the described device's
sustained rate, ``flops * efficiency``: a laptop then reproduces the step times of the
described cluster exactly, whatever else runs on it.

Counting. ``FlopCount`` is a ``TorchDispatchMode`` (one per thread: torch keeps the mode
stack per thread) that sees every aten op and counts what ``torch.utils.flop_counter``'s
formula table (``flop_registry``, the table ``FlopCounterMode`` uses) gives for it: matrix
products, convolutions, attention; element-wise work, reductions and copies count 0, as on a
GPU where the matrix units dominate. Two additions: CPU attention kernels
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which torch's table
misses, get the attention formula of the GPU kernels; and the four matrix products are
counted from their shapes directly (torch's formulas go through a pytree of shapes, which
cost twice the op itself on small tensors). ``FlopCounterMode`` itself is not used: it
tracks modules through global hooks and prints a table on exit.

Cost. A Python dispatch mode adds a few microseconds to every op, so small models run
slower in wall time under the FLOP model (never in virtual time); ``minidist bench
emulation`` measures it. With CPU-time compute nothing is intercepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..checks import positive_number

_aten = torch.ops.aten
# (op packet, index of the left matrix): flops = 2 * numel(left) * columns(right)
_PRODUCTS = {_aten.mm: 0, _aten.bmm: 0, _aten.addmm: 1, _aten.baddbmm: 1}
_CPU_SDPA = _aten._scaled_dot_product_flash_attention_for_cpu
_CPU_SDPA_BACKWARD = _aten._scaled_dot_product_flash_attention_for_cpu_backward


@dataclass(frozen=True, repr=False)
class Compute:
    """A device's speed: ``flops`` peak FLOP/s, of which it sustains ``efficiency`` (a
    fraction in (0, 1]) on the model's matrix products. ``efficiency=None`` takes the cost
    model's (``costmodel/cluster.py`` ``A100_EFFICIENCY``: fitted on Megatron-LM's Table 1,
    first row), so virtual time and ``md.costmodel.predict`` agree on a described cluster."""

    flops: float
    efficiency: float | None = None
    name: str = ""

    def __post_init__(self):
        positive_number(self.flops, "md.Compute flops", finite=True)
        if self.efficiency is None:
            from ..costmodel.cluster import A100_EFFICIENCY

            object.__setattr__(self, "efficiency", A100_EFFICIENCY)
        if positive_number(self.efficiency, "md.Compute efficiency", finite=True) > 1:
            raise ValueError(f"md.Compute efficiency is a fraction of the peak, in (0, 1], "
                             f"got {self.efficiency!r}")

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        return f"Compute(flops={self.flops:.4g}, efficiency={self.efficiency:.4g}{label})"

    @property
    def rate(self) -> float:
        """Sustained FLOP/s: ``flops * efficiency``."""
        return self.flops * self.efficiency

    def seconds(self, flops: float) -> float:
        """How long the device takes for ``flops`` floating-point operations."""
        return flops / self.rate

    @classmethod
    def a100(cls, precision: str = "bf16", efficiency: float | None = None) -> Compute:
        """One A100 (``Cluster.dgx_a100``'s figures and citation, ``costmodel/cluster.py``)
        at ``precision`` ("bf16", "fp16", "fp32")."""
        from ..costmodel.cluster import A100_PEAK_FLOPS

        return cls._preset(A100_PEAK_FLOPS, "A100", precision, efficiency)

    @classmethod
    def h100(cls, precision: str = "bf16", efficiency: float | None = None) -> Compute:
        """One H100 SXM (``Cluster.dgx_h100``'s figures; the A100's efficiency is assumed)."""
        from ..costmodel.cluster import H100_PEAK_FLOPS

        return cls._preset(H100_PEAK_FLOPS, "H100", precision, efficiency)

    @classmethod
    def _preset(cls, peaks: dict, device: str, precision: str, efficiency) -> Compute:
        if precision not in peaks:
            raise ValueError(f"md.Compute.{device.lower()}: unknown precision {precision!r}; "
                             f"the datasheet gives {', '.join(peaks)}")
        return cls(peaks[precision], efficiency, f"{device} {precision}")


_COMPOSITE: dict = {}  # op overload -> has a composite (decomposing) kernel


def _composite(func) -> bool:
    """Whether ``func`` decomposes into other ops (``OpOverload.decompose`` would run it),
    asked once per op: re-entering the mode for every op would cost more than the op."""
    known = _COMPOSITE.get(func)
    if known is None:
        key = torch._C.DispatchKey.CompositeImplicitAutograd
        known = _COMPOSITE[func] = key in func.py_kernels or \
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)
    return known


class FlopCount(TorchDispatchMode):
    """Counts the FLOPs of the ops run on the thread that entered it (module docstring)."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        left = _PRODUCTS.get(packet)
        if left is not None:
            self.flops += 2 * args[left].numel() * args[left + 1].shape[-1]
            return func(*args, **kwargs)
        formula = flop_registry.get(packet)
        if formula is None and packet not in (_CPU_SDPA, _CPU_SDPA_BACKWARD):
            if _composite(func):  # (seen under inference_mode): count what it runs
                with self:
                    return func.decompose(*args, **kwargs)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self.flops += self._count(packet, formula, args, kwargs, out)
        return out

    @staticmethod
    def _count(packet, formula, args, kwargs, out) -> int:
        if packet is _CPU_SDPA:
            return sdpa_flop_count(*(a.shape for a in args[:3]))
        if packet is _CPU_SDPA_BACKWARD:
            return sdpa_backward_flop_count(*(a.shape for a in args[:4]))
        return formula(*args, **kwargs, out_val=out)
