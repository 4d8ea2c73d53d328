"""The learner's collective calls, recorded as they happen (``record_collectives``): the
checks that count communication exactly (exercises 05-10: one all-reduce of b*s*h elements,
one reduce per owner, one reduce-scatter and one all-gather per step) read what each call
was given, not only what came out. Runs in the child, on the ranks; what an exercise keeps
of a ``Call`` goes back to the grader as plain data."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ...collectives import api
from .sandbox import observe

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "reduce_scatter",
               "all_gather", "gather", "scatter", "all_to_all")


@dataclass(frozen=True)
class Call:
    """One call of an md collective: its name, the communicator, what it was given (a
    tensor, or a list for the coalesced form) and its size, its op ("sum" where it takes
    none) and, for a reduce, its destination."""

    name: str
    comm: Any
    sent: Any
    numel: int
    op: str
    dst: int | None


def numel(t) -> int:
    """Elements of a tensor or a list of tensors; -1 for anything else."""
    try:
        if isinstance(t, (list, tuple)):
            return sum(int(torch.as_tensor(x).numel()) for x in t)
        return int(torch.as_tensor(t).numel())
    except (TypeError, ValueError, RuntimeError):
        return -1


def describe(name: str, original, args: tuple, kwargs: dict) -> Call:
    """The call ``original(*args, **kwargs)`` of collective ``name``, by its parameters'
    names (a call that does not bind is recorded with what it has: its own error follows)."""
    try:
        bound = inspect.signature(original).bind(*args, **kwargs).arguments
    except TypeError:
        bound = dict(zip(("comm", "t"), args))
    sent = bound.get("t", bound.get("tensors_"))
    op = bound.get("op", "sum")
    dst = bound.get("dst", 0) if name == "reduce" else None
    return Call(name, bound.get("comm"), sent, numel(sent),
                op if isinstance(op, str) else repr(op), dst)


def record_collectives(on_call: Callable[[Call], None],
                       names: Iterable[str] = COLLECTIVES) -> None:
    """From now on in this process, every call of these md collectives (however imported:
    ``sandbox.observe``) first passes its ``Call`` to ``on_call``, then runs. Calling again
    replaces the recorder."""
    for name in names:
        observe(getattr(api, name), _around(name, on_call))


def _around(name: str, on_call: Callable[[Call], None]):
    def around(original, *args, **kwargs):
        on_call(describe(name, original, args, kwargs))
        return original(*args, **kwargs)
    return around
