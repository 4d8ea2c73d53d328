"""What a pipeline measures of itself: the bytes of activations kept for backward, and the
bubble read off a real timeline.

Activations. Autograd keeps, for each micro-batch between its forward and its backward, the
tensors the backward needs (``saved_tensors_hooks`` sees each one as it is saved). Counting
distinct storages, parameters left out, gives the activation memory a micro-batch pins; a
stage holds the sum over its micro-batches in flight: m of them under GPipe, at most p - r
on stage r under 1F1B (Narayanan et al. 2021).

Bubble. With each forward and backward on ``comm.timeline`` (categories "forward" and
"backward"), the idle share of a step over p stages is

    bubble = 1 - sum(busy time) / (p x (last end - first start))

to compare with ``md.costmodel.bubble_fraction(p, m)`` = (p - 1) / (m + p - 1). Stages that
keep no timeline (torch's) get the same spans from module and autograd hooks
(:class:`ModuleSpans`), and the same memory meter (:class:`LiveSavedBytes`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import nn

COMPUTE = ("forward", "backward")


class SavedBytes:
    """``with SavedBytes(exclude) as meter: out = module(x)``; then ``meter.bytes`` is what
    the forward saved for backward (distinct storages; ``exclude``: parameters' data_ptrs)."""

    def __init__(self, exclude: set[int] | None = None):
        self.exclude = exclude or set()
        self.bytes = 0
        self._seen: set[int] = set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.exclude and ptr not in self._seen:
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class _Held:
    """A saved tensor as autograd keeps it; tells the meter when autograd lets it go."""
    __slots__ = ("tensor", "meter", "ptr")

    def __init__(self, tensor: torch.Tensor, meter: LiveSavedBytes, ptr: int):
        self.tensor, self.meter, self.ptr = tensor, meter, ptr

    def __del__(self) -> None:
        self.meter.release(self.ptr)


class LiveSavedBytes:
    """``with LiveSavedBytes(exclude) as meter: sched.step(...)``; then ``meter.peak`` is the
    most activation memory held for backward at any moment of the block: bytes are counted
    when autograd saves a storage and uncounted when autograd frees it (after the backward
    that used it). Works around any code, torch's pipelining schedules included."""

    def __init__(self, exclude: set[int] | None = None):
        self.exclude = exclude or set()
        self.live = self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage ptr -> [references, bytes]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda h: h.tensor
                                                               if isinstance(h, _Held) else h)

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.exclude:
            return t
        ref = self._refs.setdefault(ptr, [0, storage.nbytes()])
        if ref[0] == 0:
            self.live += ref[1]
            self.peak = max(self.peak, self.live)
        ref[0] += 1
        return _Held(t, self, ptr)

    def release(self, ptr: int) -> None:
        ref = self._refs[ptr]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[ptr]

    def __enter__(self) -> LiveSavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class ModuleSpans:
    """Forward and backward spans of modules, taken with hooks, for stages that keep no
    timeline (torch.distributed.pipelining's): a forward from the module's pre-hook to its
    hook; a backward from the gradient reaching the output to the last gradient the backward
    produces (the input's or a parameter's). ``events`` are event dicts for
    :func:`measured_bubble` and ``md.plot_gantt``."""

    def __init__(self, modules: list[nn.Module], rank: int):
        self.rank, self.events, self._start = rank, [], 0.0
        self._open: dict | None = None
        for module in modules:
            module.register_forward_pre_hook(self._forward_start)
            module.register_forward_hook(self._forward_end)
            for p in module.parameters():
                p.register_post_accumulate_grad_hook(self._mark)

    def _event(self, cat: str, start: float) -> dict:
        event = {"name": cat[0].upper(), "cat": cat, "start": start, "end": start,
                 "bytes": 0, "peer": None, "rank": self.rank}
        self.events.append(event)
        return event

    def _forward_start(self, module, args) -> None:
        self._start = time.perf_counter()

    def _forward_end(self, module, args, out) -> None:
        self._event("forward", self._start)["end"] = time.perf_counter()
        if out.requires_grad:
            out.register_hook(self._backward_start)
        if args and args[0].requires_grad:
            args[0].register_hook(self._mark)

    def _backward_start(self, grad) -> None:
        self._open = self._event("backward", time.perf_counter())

    def _mark(self, *_) -> None:
        if self._open is not None:
            self._open["end"] = time.perf_counter()


def compute_events(timelines: Iterable) -> list[dict]:
    """The forward and backward events of ``Results.timelines`` (one list of dicts per
    rank), of Timelines, or of event dicts: ``md.plot_gantt([compute_events(tls)])`` draws
    the pipeline without its message events."""
    out: list[dict] = []
    for tl in timelines:
        if isinstance(tl, dict):
            out.append(tl)
        elif hasattr(tl, "as_dicts"):
            out.extend(tl.as_dicts())
        else:
            out.extend(tl)
    return [e for e in out if e["cat"] in COMPUTE]


def measured_bubble(timelines: Iterable) -> float:
    """The idle share of the forward/backward events' span, over all ranks that ran any:
    1 - busy / (p x makespan). Record one step (clear the timelines before it)."""
    events = compute_events(timelines)
    if not events:
        raise ValueError("no 'forward'/'backward' events: trace the step (md.launch(..., "
                         "trace=True) or comm.timeline.enable())")
    p = len({e["rank"] for e in events})
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    busy = sum(e["end"] - e["start"] for e in events)
    return 1.0 - busy / (p * span) if span > 0 else 0.0
