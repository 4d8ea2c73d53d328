"""Stage 3's machinery (``stage3.py``): parameters sharded too, gathered one unit at a time.

Between steps rank r holds only shard r of every parameter. A *unit* is a submodule whose
parameters are gathered together (FSDP's ``fully_shard`` unit, Zhao et al. VLDB 2023):

* forward: a forward pre-hook all-gathers the unit's flat buffer just before the unit runs;
  a forward hook frees it (the storage is resized to 0 bytes) right after, and hooks the
  unit's outputs, so that
* backward: when the gradient of the unit's output arrives (just before autograd runs the
  unit's backward) the buffer is gathered again; once every parameter of the unit has its
  gradient, ``grad_buckets.GradientShards`` reduce-scatters them and frees the buffer.

Autograd's saved tensors need no special handling: the parameters are views of the unit's
flat buffer, so what autograd saved (a parameter, or a view such as ``weight.t()``) points
at that storage; freeing resizes the storage to 0 bytes (memory really returned, even
though autograd still references it), gathering refills the same storage and points the
parameters at it again, by the time the unit's backward reads it. Parameters outside every
unit, and parameters shared by two units (a tied embedding and output head), belong to the
*root* unit, which stays gathered from the start of forward to the end of backward, as
FSDP's root does.

Cost (Rajbhandari et al. SC 2020, section 7.2.3): per step two all-gathers (forward and
backward) and one reduce-scatter, each (p - 1)/p * Psi elements per rank: 3 Psi against
the 2 Psi of stages 1 and 2 (1.5x). The root unit is gathered once, so a model with a big
root moves a little less (``costmodel.zero.zero_step_bytes``). Peak parameter memory: the
shards plus the root plus the largest unit (plus the next, with prefetch).
"""

from __future__ import annotations

from concurrent.futures import Future

import torch
from torch import nn

from ...collectives import all_gather
from ...transports.clock import WALL
from ..data.graph import tensors_in
from ..data.scheduler import CommThread
from .flat_shards import FlatShards, flat_parameters, storage_bytes


def default_units(module: nn.Module) -> list[nn.Module]:
    """The unit policy when none is given: the children of the outermost ``nn.ModuleList``
    and ``nn.Sequential`` containers (a GPT's blocks, a Sequential's layers) that hold
    parameters. A model without containers is one unit (the root)."""
    units: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, (nn.ModuleList, nn.Sequential)):
                units.extend(c for c in child.children() if any(True for _ in c.parameters()))
            else:
                visit(child)

    if isinstance(module, (nn.ModuleList, nn.Sequential)):
        return [c for c in module.children() if any(True for _ in c.parameters())]
    visit(module)
    return units


def units_of(module: nn.Module, units: list[nn.Module] | None) -> list[nn.Module]:
    """The units to gather: ``units`` as given (each must be a submodule of ``module``), or
    ``default_units(module)`` when None."""
    if units is None:
        return default_units(module)
    inside = {id(m) for m in module.modules()}
    if any(id(u) not in inside for u in units):
        raise ValueError("units must be submodules of the module ZeRO wraps; one of them is not")
    return list(units)


def plan_units(params: list[nn.Parameter], units: list[nn.Module]) -> tuple[list[list[int]],
                                                                             list[int | None]]:
    """Assign each parameter index to the one unit that holds it, or to the root when no unit
    or several units hold it (shared parameters). Returns (groups, unit of each group),
    ordered as backward completes them: units in reverse order, the root (``None``) last."""
    owner: dict[int, int | None] = {}
    for u, unit in enumerate(units):
        for p in unit.parameters():
            owner[id(p)] = None if id(p) in owner else u  # held twice: the root's
    by_unit: dict[int | None, list[int]] = {}
    for i, p in enumerate(params):
        by_unit.setdefault(owner.get(id(p)), []).append(i)
    order = [u for u in reversed(range(len(units))) if u in by_unit]
    order += [None] if None in by_unit else []
    return [by_unit[u] for u in order], order


class ParameterGatherer:
    """Holds each group's flat buffer, full only while its unit runs; ``shards[k]`` (this
    rank's piece, the optimizer's parameter) is the only persistent copy."""

    def __init__(self, comm, groups: list[FlatShards], modules: list[nn.Module | None]):
        self.comm, self.groups = comm, groups
        self.flats = flat_parameters(groups)  # parameters become views of the flat buffers
        self.shards = [nn.Parameter(g.shard_of(flat).clone()) for g, flat in zip(groups,
                                                                                 self.flats)]
        self.gathered = [True] * len(groups)
        self.peak_bytes = 0  # most parameter bytes held at once since the last reset
        self.root = next((k for k, m in enumerate(modules) if m is None), None)
        self._handles = []
        for k, m in enumerate(modules):
            self.free(k)
            if m is not None:
                self._handles.append(m.register_forward_pre_hook(
                    lambda _m, _a, k=k: self.gather(k)))
                self._handles.append(m.register_forward_hook(
                    lambda _m, _a, out, k=k: self._after_forward(k, out)))

    def gather(self, k: int) -> None:
        """All-gather group k's shards into its flat buffer (the parameters' storage)."""
        if not self.gathered[k]:
            self._gather_now(k)

    def _gather_now(self, k: int) -> None:
        g, flat = self.groups[k], self.flats[k]
        flat.untyped_storage().resize_(g.padded * flat.element_size())
        with self.comm.timeline.span(f"all-gather {k}"), torch.no_grad():
            if g.padded:
                flat.copy_(all_gather(self.comm, self.shards[k].detach()).reshape(-1))
            for p, view in zip(g.params, g.views(flat)):
                p.data = view
        self.gathered[k] = True
        self.peak_bytes = max(self.peak_bytes, storage_bytes(self.storages()))

    def free(self, k: int) -> None:
        """Give group k's full parameters back (0 bytes); the shard stays."""
        self.release(k)

    def release(self, k: int) -> None:
        """Free group k now. The parameters become empty tensors meanwhile, so that touching
        one outside its unit fails with a shape error instead of reading freed memory."""
        self.flats[k].untyped_storage().resize_(0)
        for p in self.groups[k].params:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.gathered[k] = False

    def _after_forward(self, k: int, out) -> None:
        for t in tensors_in(out):
            if t.requires_grad:  # gather again right before this unit's backward
                t.register_hook(lambda _g, k=k: self.gather(k))
        self.free(k)

    def before_forward(self) -> None:
        if self.root is not None:
            self.gather(self.root)

    def after_forward(self, out) -> None:
        """The root stays gathered for backward, unless there will be none."""
        if self.root is not None and not any(t.requires_grad for t in tensors_in(out)):
            self.free(self.root)

    def full_flats(self) -> list[torch.Tensor]:
        """Every group's full flat buffer, gathered into new tensors (collective)."""
        out = []
        for k in range(len(self.groups)):
            was = self.gathered[k]
            self.gather(k)
            out.append(self.flats[k].clone())
            if not was:
                self.free(k)
        return out

    def storages(self) -> list[torch.Tensor]:
        return [*self.flats, *self.shards]


class PrefetchingGatherer(ParameterGatherer):
    """Stage 3 with prefetch (FSDP's ``forward_prefetch`` / ``backward_prefetch``): while
    unit i computes, a communication thread already gathers the unit that will run next
    (i + 1 in forward, i - 1 in backward), so the all-gather can hide behind computation
    where cores or a network allow. The price: two units gathered at once.

    The next unit is known from the order the first forward ran them (FSDP2 does the same).
    Every stage-3 collective (gathers here, reduce-scatters in ``GradientShards``) goes
    through one FIFO ``thread``: a communicator runs one collective at a time, and the
    submission order, decided by the hooks on the main thread, is the same on every rank."""

    def __init__(self, comm, groups: list[FlatShards], modules: list[nn.Module | None]):
        self.inflight: dict[int, Future] = {}
        self.thread = CommThread("minidist-zero-prefetch", getattr(comm, "clock", WALL))
        super().__init__(comm, groups, modules)
        self.order: list[int] = []  # units in the order forward ran them
        for k, m in enumerate(modules):
            if m is not None:
                self._handles.append(m.register_forward_pre_hook(
                    lambda _m, _a, k=k: self._prefetch(k, +1)))

    def _submit(self, k: int) -> None:
        if not self.gathered[k] and k not in self.inflight:
            self.inflight[k] = self.thread.submit(lambda: self._gather_now(k))

    def gather(self, k: int) -> None:
        self._submit(k)
        if k in self.inflight:
            self.thread.result(self.inflight.pop(k))  # raises what the gather raised

    def free(self, k: int) -> None:
        if k in self.inflight:
            self.thread.result(self.inflight.pop(k))
        self.release(k)

    def _prefetch(self, k: int, direction: int) -> None:
        """After unit k is gathered: start gathering its neighbour in run order."""
        if k not in self.order:
            self.order.append(k)
            return  # the first forward: the order is still being learned
        i = self.order.index(k) + direction
        if 0 <= i < len(self.order):
            self._submit(self.order[i])

    def _after_forward(self, k: int, out) -> None:
        for t in tensors_in(out):
            if t.requires_grad:
                t.register_hook(lambda _g, k=k: self._gather_backward(k))
        self.free(k)

    def _gather_backward(self, k: int) -> None:
        self.gather(k)
        self._prefetch(k, -1)
