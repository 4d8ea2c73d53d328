"""One pipeline stage: a submodule on this rank, and the messages it trades with its
neighbours (activations forward to stage s + 1, gradients backward to stage s - 1).

``md.PipelineStage(submodule, comm)`` is stage ``comm.rank`` of ``comm.world_size``
(torch.distributed.pipelining's ``PipelineStage`` with the process group in the place of
``stage_index, num_stages``). For the interleaved schedule a rank holds several *virtual*
stages: ``PipelineStage(chunk, comm, stage_index=c * p + comm.rank, num_stages=v * p)``;
stage s lives on rank s mod p, so a micro-batch loops v times round the ranks.

Shapes. A receiver must allocate its buffer before the message arrives. In every step each
stage tells the next one, ahead of its first activation, whether shapes changed since the
last step (one small message per link and step; stage 0 decides from its input). If they
did, every activation travels after a small header (dtype and shape) and the receiver
remembers the shapes; if not, the receiver allocates from memory and posts its receive
early, so the message can land while the stage computes. A gradient always has the shape of
the activation it belongs to, which the stage itself sent, so it never needs a header. Sends
are ``isend``, waited for only at the end of the step: a stage never stalls on its own send.

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

import time

import torch
from torch import nn

from .measure import SavedBytes

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.bool)
_MAX_DIMS = 8
ACT, GRAD, HEADER, FLAG = 0, 1, 2, 3


def tag(microbatch: int, kind: int, dest: int, num_stages: int) -> int:
    """The tag of micro-batch ``microbatch``'s activation, gradient or header for virtual
    stage ``dest`` (``microbatch=-1``: the step's shape flag). Distinct for every message
    of a step, so two chunks' messages between the same two ranks never meet."""
    return 4 * ((microbatch + 1) * num_stages + dest) + kind


def _header(t: torch.Tensor) -> torch.Tensor:
    if t.dim() > _MAX_DIMS or t.dtype not in _DTYPES:
        raise TypeError(f"a stage output must be a tensor of at most {_MAX_DIMS} dimensions "
                        f"and one of {_DTYPES}, got {t.dtype} of shape {tuple(t.shape)}")
    h = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
    h[0], h[1] = _DTYPES.index(t.dtype), t.dim()
    h[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return h


def _meta(h: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(h[2:2 + int(h[1])].tolist()), _DTYPES[int(h[0])]


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
    stage s - 1 and its output's gradient from stage s + 1. Driven by a schedule
    (``md.ScheduleGPipe``, ``md.Schedule1F1B``), which calls :meth:`forward` and
    :meth:`backward` in the order of its action list."""

    def __init__(self, submodule: nn.Module, comm, stage_index: int | None = None,
                 num_stages: int | None = None):
        if not isinstance(submodule, nn.Module):
            raise TypeError(f"submodule must be a torch.nn.Module, got {type(submodule)}")
        self.submodule, self.comm = submodule, comm
        self.stage_index, self.num_stages = _check_index(comm, stage_index, num_stages)
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.num_stages - 1
        p = comm.world_size
        self.prev_rank, self.next_rank = (self.stage_index - 1) % p, (self.stage_index + 1) % p
        self._params = {p.data_ptr() for p in submodule.parameters()}
        self._act_meta: dict[int, tuple] = {}  # micro-batch -> (shape, dtype) received
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._bytes: dict[int, int] = {}  # activation bytes each micro-batch holds
        self._recvs: dict[tuple[int, int], tuple] = {}  # (kind, mb) -> (request, buffer)
        self._sends: list = []
        self._flag: tuple | None = None  # (request, buffer) of this step's incoming flag
        self._headers: bool | None = None  # do headers come to this stage this step?
        self._headers_out: bool | None = None  # will this stage send them? (None: told)
        self._send_headers = False
        self._stepped = False
        self.measure_memory = True  # off: autograd's saved-tensor hooks are free for others
        self.peak_activation_bytes = self.peak_in_flight = 0

    def __repr__(self) -> str:
        return f"PipelineStage({self.stage_index} of {self.num_stages})"

    # -- the step ------------------------------------------------------------------------------
    def begin_step(self, changed: bool = False) -> None:
        """Start a step; on the first stage ``changed`` says the input shapes changed."""
        self._headers = self._headers_out = None
        if self.is_first:
            self._headers, self._headers_out = False, changed or not self._stepped
        else:  # the flag comes ahead of stage s - 1's first activation; wait for it lazily
            buf = torch.empty(1, dtype=torch.int64)
            self._flag = (self.comm.irecv(buf, self.prev_rank, self._tag(-1, FLAG, 0)), buf)
        self._stepped = True

    def _flag_arrived(self, block: bool) -> bool:
        if self._headers is None:
            req, buf = self._flag
            if not block and not req.test():
                return False
            req.wait()
            self._headers = bool(buf.item())
            self._headers_out = self._headers  # and tells the next stage the same
        return True

    def end_step(self) -> None:
        """Wait for this step's sends; every micro-batch must have gone forward and back."""
        for req in self._sends:
            req.wait()
        self._sends.clear()
        if self._inputs or self._outputs:
            raise RuntimeError(f"stage {self.stage_index}: micro-batches "
                               f"{sorted(self._outputs)} were forwarded but never backwarded")

    def reset_peak(self) -> None:
        self.peak_activation_bytes = self.peak_in_flight = 0

    # -- forward and backward of one micro-batch ----------------------------------------------
    def forward(self, i: int, x: torch.Tensor | None = None) -> torch.Tensor:
        """Run micro-batch ``i`` (``x`` on the first stage, received otherwise); send the
        output on, keep what backward needs; return the output."""
        if not self.is_first:
            x = self._receive(ACT, i).requires_grad_(True)
        start = time.perf_counter()
        if self.measure_memory:
            with SavedBytes(self._params) as saved:
                out = self.submodule(x)
            self._bytes[i] = saved.bytes
        else:
            out, self._bytes[i] = self.submodule(x), 0
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage {self.stage_index} returned {type(out).__name__}; a "
                            f"pipeline stage must return one tensor")
        self.comm.timeline.record(self._name("F", i), "forward", start, time.perf_counter())
        self._inputs[i], self._outputs[i] = x, out
        if not self.is_last:
            self._send(out.detach(), ACT, i)
            self._post(GRAD, i, out.shape, out.dtype)
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
        grad = None if self.is_last else self._receive(GRAD, i)
        start = time.perf_counter()
        if self.is_last:
            if loss is None:
                raise ValueError("the last stage's backward needs the micro-batch's loss")
            loss.backward()
        elif out.requires_grad:
            torch.autograd.backward(out, grad)
        self.comm.timeline.record(self._name("B", i), "backward", start, time.perf_counter())
        if not self.is_first:
            self._send(x.grad if x.grad is not None else torch.zeros_like(x), GRAD, i)
        del self._bytes[i]

    def prefetch(self, i: int) -> None:
        """Post the receive of micro-batch ``i``'s activation now, if its shape is known
        without a header, so that it can arrive while this stage computes."""
        if not self.is_first and (ACT, i) not in self._recvs and i in self._act_meta \
                and self._flag_arrived(block=False) and not self._headers:
            self._post(ACT, i, *self._act_meta[i])

    # -- messages ------------------------------------------------------------------------------
    def _name(self, kind: str, i: int) -> str:
        chunk = self.stage_index // self.comm.world_size
        return f"{kind}{i}" + (f".{chunk}" if chunk else "")

    def _tag(self, i: int, kind: int, dest_offset: int) -> int:
        return tag(i, kind, self.stage_index + dest_offset, self.num_stages)

    def _send(self, t: torch.Tensor, kind: int, i: int) -> None:
        step = 1 if kind == ACT else -1
        peer = self.next_rank if kind == ACT else self.prev_rank
        t = t.contiguous()
        if kind == ACT and self._headers_out is not None:  # the step's first activation
            flag = torch.tensor([int(self._headers_out)], dtype=torch.int64)
            self._sends.append(self.comm.isend(flag, peer, self._tag(-1, FLAG, 1)))
            self._headers_out, self._send_headers = None, self._headers_out
        if kind == ACT and self._send_headers:
            self._sends.append(self.comm.isend(_header(t), peer, self._tag(i, HEADER, 1)))
        self._sends.append(self.comm.isend(t, peer, self._tag(i, kind, step)))

    def _post(self, kind: int, i: int, shape, dtype) -> None:
        peer = self.prev_rank if kind == ACT else self.next_rank
        buf = torch.empty(shape, dtype=dtype)
        self._recvs[(kind, i)] = (self.comm.irecv(buf, peer, self._tag(i, kind, 0)), buf)

    def _receive(self, kind: int, i: int) -> torch.Tensor:
        if (kind, i) not in self._recvs:  # an activation not prefetched
            self._flag_arrived(block=True)
            if self._headers:
                h = torch.empty(2 + _MAX_DIMS, dtype=torch.int64)
                self.comm.recv(h, self.prev_rank, self._tag(i, HEADER, 0))
                self._act_meta[i] = _meta(h)
            elif i not in self._act_meta:
                raise RuntimeError(f"stage {self.stage_index}: no shape known for micro-batch "
                                   f"{i}; every stage must start its schedule together")
            self._post(kind, i, *self._act_meta[i])
        req, buf = self._recvs.pop((kind, i))
        req.wait()
        return buf
