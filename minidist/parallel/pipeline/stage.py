"""One pipeline stage: a submodule on this rank, run on micro-batches whose inputs come from
stage s - 1 and whose output gradients come from stage s + 1.

``md.PipelineStage(submodule, comm)`` is stage ``comm.rank`` of ``comm.world_size``
(torch.distributed.pipelining's ``PipelineStage`` with the process group in the place of
``stage_index, num_stages``). For the interleaved schedule a rank holds several *virtual*
stages: ``PipelineStage(chunk, comm, stage_index=c * p + comm.rank, num_stages=v * p)``;
stage s lives on rank s mod p, so a micro-batch loops v times round the ranks.

Messages. The stage computes; ``p2p.py`` (``self.p2p``, a ``P2PCommunicator``) sends and
receives, shape headers included, with every buffer on the stage's device (``device=``, else
the submodule's, else ``comm.device``). ``forward`` and ``backward`` read as Megatron-LM's
1F1B loop: ``recv_forward``, ``forward_step``, ``send_forward``; ``recv_backward``,
``backward_step``, ``send_backward``.

Timeline. Each forward and backward is recorded on ``comm.timeline`` ("forward" and
"backward", named "F3" or, for chunk 1, "F3.1"); the spans cover the computation alone, so
the bubble measured from them (``measure.py``) counts waiting for and posting messages as
idle time, as it is for the device.

Memory. Autograd's saved-tensor hooks count the bytes each micro-batch's forward keeps for
its backward (parameters excluded; ``measure.py``), so ``peak_activation_bytes`` and
``peak_in_flight`` are measured, not assumed: GPipe holds all m micro-batches, 1F1B at most
p - r on stage r.
"""

from __future__ import annotations

import torch
from torch import nn

from ...transports.clock import WALL
from .measure import SavedBytes
from .p2p import P2PCommunicator, stage_device


def _now(comm) -> float:
    """The rank's clock (``comm.now()``: virtual under ``clock="virtual"``); the wall clock
    for a communicator-like object without one (the tests' stand-ins)."""
    return getattr(comm, "clock", WALL).now()


def _check_index(comm, stage_index, num_stages) -> tuple[int, int]:
    p = comm.world_size
    n = p if num_stages is None else num_stages
    s = comm.rank if stage_index is None else stage_index
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n % p:
        raise ValueError(f"num_stages={num_stages!r} must be a multiple of comm.world_size={p} "
                         f"(one stage per rank, or v virtual stages per rank)")
    if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n or s % p != comm.rank:
        raise ValueError(f"stage_index={stage_index!r} does not live on rank {comm.rank}: "
                         f"stage s of {n} lives on rank s % comm.world_size ({p})")
    return s, n


class PipelineStage:
    """Stage ``stage_index`` (default ``comm.rank``) of ``num_stages`` (default
    ``comm.world_size``): runs ``submodule`` on micro-batches, receives its input from
    stage s - 1 and its output's gradient from stage s + 1, on ``device`` (default: the
    submodule's, else ``comm.device``). Driven by a schedule (``md.ScheduleGPipe``,
    ``md.Schedule1F1B``), which calls :meth:`forward` and :meth:`backward` in the order of
    its action list."""

    def __init__(self, submodule: nn.Module, comm, stage_index: int | None = None,
                 num_stages: int | None = None, device: torch.device | str | None = None):
        if not isinstance(submodule, nn.Module):
            raise TypeError(f"submodule must be a torch.nn.Module, got {type(submodule)}")
        self.submodule, self.comm = submodule, comm
        self.stage_index, self.num_stages = _check_index(comm, stage_index, num_stages)
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.num_stages - 1
        self.device = stage_device(submodule, comm, device)
        self.p2p = P2PCommunicator(comm, self.stage_index, self.num_stages, self.device)
        self._params = {p.data_ptr() for p in submodule.parameters()}
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._bytes: dict[int, int] = {}  # activation bytes each micro-batch holds
        self.measure_memory = True  # off: autograd's saved-tensor hooks are free for others
        self.peak_activation_bytes = self.peak_in_flight = 0

    def __repr__(self) -> str:
        return f"PipelineStage({self.stage_index} of {self.num_stages})"

    # -- the step ------------------------------------------------------------------------------
    def begin_step(self, changed: bool = False) -> None:
        """Start a step; on the first stage ``changed`` says the input shapes changed."""
        self.p2p.begin_step(changed)

    def end_step(self) -> None:
        """Wait for this step's sends; every micro-batch must have gone forward and back."""
        self.p2p.wait_sends()
        if self._inputs or self._outputs:
            raise RuntimeError(f"stage {self.stage_index}: micro-batches "
                               f"{sorted(self._outputs)} were forwarded but never backwarded")

    def reset_peak(self) -> None:
        self.peak_activation_bytes = self.peak_in_flight = 0

    def prefetch(self, i: int) -> None:
        """Post the receive of micro-batch ``i``'s activation early, if its shape is known."""
        self.p2p.prefetch_forward(i)

    # -- forward and backward of one micro-batch ----------------------------------------------
    def forward(self, i: int, x: torch.Tensor | None = None) -> torch.Tensor:
        """Run micro-batch ``i`` (``x`` on the first stage, received otherwise); send the
        output on, keep what backward needs; return the output."""
        if not self.is_first:
            x = self.p2p.recv_forward(i).requires_grad_(True)
        out = self._forward_step(i, x)
        self._inputs[i], self._outputs[i] = x, out
        if not self.is_last:
            self.p2p.send_forward(out.detach(), i)
        self.peak_activation_bytes = max(self.peak_activation_bytes, sum(self._bytes.values()))
        self.peak_in_flight = max(self.peak_in_flight, len(self._outputs))
        return out

    def backward(self, i: int, loss: torch.Tensor | None = None) -> None:
        """Backward of micro-batch ``i`` from ``loss`` (last stage) or from the gradient
        stage s + 1 sends; send the input's gradient to stage s - 1; free the micro-batch."""
        if i not in self._outputs:
            raise RuntimeError(f"stage {self.stage_index}: backward of micro-batch {i} "
                               f"before its forward")
        out, x = self._outputs.pop(i), self._inputs.pop(i)
        output_grad = None if self.is_last else self.p2p.recv_backward(i)
        input_grad = self._backward_step(i, x, out, output_grad, loss)
        if not self.is_first:
            self.p2p.send_backward(input_grad, i)
        del self._bytes[i]

    def _forward_step(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The submodule on micro-batch ``i``, timed, counting what it saves for backward
        (Megatron's ``forward_step``)."""
        start = _now(self.comm)
        if self.measure_memory:
            with SavedBytes(self._params) as saved:
                out = self.submodule(x)
            self._bytes[i] = saved.bytes
        else:
            out, self._bytes[i] = self.submodule(x), 0
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage {self.stage_index} returned {type(out).__name__}; a "
                            f"pipeline stage must return one tensor")
        self.comm.timeline.record(self._name("F", i), "forward", start, _now(self.comm))
        return out

    def _backward_step(self, i: int, x: torch.Tensor, out: torch.Tensor,
                       output_grad: torch.Tensor | None,
                       loss: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of micro-batch ``i``, timed; the gradient of its input, None on the
        first stage (Megatron's ``backward_step``). An output that does not depend on the
        input sends zeros back."""
        start = _now(self.comm)
        if self.is_last:
            if loss is None:
                raise ValueError("the last stage's backward needs the micro-batch's loss")
            loss.backward()
        elif out.requires_grad:
            torch.autograd.backward(out, output_grad)
        self.comm.timeline.record(self._name("B", i), "backward", start, _now(self.comm))
        if self.is_first:
            return None
        return x.grad if x.grad is not None else torch.zeros_like(x)

    def _name(self, kind: str, i: int) -> str:
        chunk = self.stage_index // self.comm.world_size
        return f"{kind}{i}" + (f".{chunk}" if chunk else "")
