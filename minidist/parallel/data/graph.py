"""Looking at a forward pass's autograd graph: its output tensors, the parameters it can
reach (for ``find_unused_parameters``), and a hook at the start of its backward pass."""

from __future__ import annotations

import torch


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors inside a forward pass's output (a tensor, or lists, tuples, dicts of them)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors_in(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensors_in(x)]
    return []


def reachable_params(outputs) -> set[int]:
    """ids of the leaf tensors the autograd graph of ``outputs`` reaches: walk from each
    output's ``grad_fn`` through ``next_functions``; an ``AccumulateGrad`` node is a leaf."""
    found = {id(t) for t in tensors_in(outputs) if t.requires_grad and t.grad_fn is None}
    stack = [t.grad_fn for t in tensors_in(outputs) if t.grad_fn is not None]
    seen = set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            found.add(id(fn.variable))
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return found


def on_backward_start(outputs, fn) -> bool:
    """Call ``fn()`` when the backward pass through ``outputs`` starts (when the first
    output that requires a gradient receives it), before any parameter's gradient hook.
    Returns False if no output requires a gradient (there will be no backward pass)."""
    first = next((t for t in tensors_in(outputs) if t.requires_grad), None)
    if first is None:
        return False

    def hook(_grad):
        fn()

    first.register_hook(hook)
    return True


def at_backward_end(fn) -> None:
    """Call ``fn()`` when the autograd engine finishes the current backward pass (callbacks
    run in the order queued). Only valid while a backward pass runs."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)
