"""Synchronise less often: local SGD (periodic model averaging) and gradient accumulation.

Compression sends fewer bytes per synchronisation; these send the same bytes, less often.

* Gradient accumulation (``accumulate_gradients``): run k micro-batches, all but the last
  under ``ddp.no_sync()``, so gradients add up in ``.grad`` and one all_reduce averages the
  sum. With each micro-batch's loss divided by k, the step is exactly the large batch's
  step: the same trajectory, k times fewer all_reduces per sample, k micro-batches of
  activation memory only one at a time. The simplest form of synchronising less.
* Local SGD (``LocalSGD``): after ``warmup_steps`` synchronous (DDP) steps, every rank
  steps on its own gradients and the ranks average their *parameters* every ``period``
  steps (Lin, Stich, Patel and Jaggi, "Don't Use Large Mini-Batches, Use Local SGD", ICLR
  2020, whose post-local SGD starts local steps after a synchronous warm-up; torch's
  ``PostLocalSGDOptimizer`` with ``PeriodicModelAverager``). The replicas drift apart
  between averagings, which costs some convergence per step and buys period-fold fewer
  bytes. With period 1 and plain or momentum SGD it is DDP: averaging x - lr g_w over the
  ranks is x - lr mean(g_w), because the update is linear in the gradient.

Bytes per rank over S steps, with N parameters of s bytes and a ring all_reduce (which
sends 2 (p-1)/p N s, for gradients and parameters alike)::

    DDP:       S x 2 (p-1)/p N s
    local SGD: (W + floor((S - W) / H)) x 2 (p-1)/p N s      (W warm-up steps, period H)

``local_sgd_bytes`` below is this formula as code.

    local = md.LocalSGD(model, comm, period=4, warmup_steps=10)
    for x, y in data:
        opt.zero_grad(); loss_fn(local(x), y).backward(); opt.step()
        local.step()                     # averages the parameters every 4th step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ...checks import integer
from ...collectives import all_reduce_coalesced
from ...costmodel.collectives import ring_bytes
from .ddp import DistributedDataParallel


def averaging_count(steps: int, period: int, warmup_steps: int) -> int:
    """How many parameter averagings ``steps`` optimizer steps do."""
    return max(0, steps - warmup_steps) // period


def local_sgd_bytes(numel: int, element_size: int, world_size: int, steps: int, period: int,
                    warmup_steps: int = 0, rank: int = 0) -> int:
    """Bytes ``rank`` sends in ``steps`` steps of local SGD with ring all_reduces:
    (W + floor((S - W) / H)) all_reduces of N elements (``steps`` <= W: all DDP steps)."""
    all_reduces = min(steps, warmup_steps) + averaging_count(steps, period, warmup_steps)
    return all_reduces * ring_bytes(numel, element_size, world_size, rank)


def average_parameters(comm, params: Sequence[torch.Tensor], algorithm: str = "auto") -> None:
    """Replace every parameter by its mean over the ranks: one coalesced all_reduce, whose
    result is bitwise the same on every rank (torch's ``average_parameters``)."""
    tensors = [p.detach() for p in params]
    if tensors:
        all_reduce_coalesced(comm, tensors, op="avg", algorithm=algorithm)


class LocalSGD(nn.Module):
    """Post-local SGD: ``warmup_steps`` DDP steps, then local steps with the parameters
    averaged every ``period`` steps. Call ``step()`` after every ``optimizer.step()``.

    The module is wrapped in ``md.DistributedDataParallel`` (``ddp_kwargs`` are passed on):
    it starts the replicas equal and averages the gradients during the warm-up; after it,
    DDP's ``require_backward_grad_sync`` is off and backward sends nothing. ``steps``:
    optimizer steps so far; ``averagings``: parameter averagings so far. Momentum and other
    optimizer state stay local, as in torch's ``PostLocalSGDOptimizer``."""

    def __init__(self, module: nn.Module, comm, period: int, warmup_steps: int = 0,
                 algorithm: str = "auto", **ddp_kwargs):
        super().__init__()
        _check(period, warmup_steps)
        self.ddp = DistributedDataParallel(module, comm, algorithm=algorithm, **ddp_kwargs)
        self.comm = comm
        self.period, self.warmup_steps, self.algorithm = period, warmup_steps, algorithm
        self.steps = self.averagings = 0
        self.ddp.require_backward_grad_sync = warmup_steps > 0

    @property
    def module(self) -> nn.Module:
        """The wrapped model (one registered copy: ``self.ddp.module``)."""
        return self.ddp.module

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    @property
    def synchronous(self) -> bool:
        """Does the next step average gradients (still in the warm-up)?"""
        return self.steps < self.warmup_steps

    def step(self) -> bool:
        """After ``optimizer.step()``: count the step, average the parameters if this step
        ends a period (returns True then), and leave the warm-up when it is over."""
        self.steps += 1
        self.ddp.require_backward_grad_sync = self.synchronous
        if self.steps <= self.warmup_steps or (self.steps - self.warmup_steps) % self.period:
            return False
        params = [p for p in self.module.parameters() if p.requires_grad]
        average_parameters(self.comm, params, self.algorithm)
        self.averagings += 1
        return True

    def bytes_sent(self, rank: int | None = None) -> int:
        """Bytes ``rank`` (default: this one) has sent for its steps so far, by the formula
        (``local_sgd_bytes``; exact with ``algorithm="ring"``)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in params)
        size = params[0].element_size() if params else 1
        rank = self.comm.rank if rank is None else rank
        return local_sgd_bytes(numel, size, self.comm.world_size, self.steps, self.period,
                               self.warmup_steps, rank)

    def extra_repr(self) -> str:
        return f"period={self.period}, warmup_steps={self.warmup_steps}"


def accumulate_gradients(ddp, micro_batches: Sequence[tuple], loss_fn: Callable) -> float:
    """Backward on every ``(x, y)`` micro-batch, all but the last under ``ddp.no_sync()``:
    one all_reduce for the lot. Each loss ``loss_fn(ddp, x, y)`` (a mean over its samples)
    is divided by the number of micro-batches, so with equal micro-batches ``.grad`` ends
    as the gradient of the mean loss over all of them: the large batch's. Returns that mean
    loss. Call ``optimizer.step()`` after it."""
    if not micro_batches:
        raise ValueError("micro_batches is empty: give at least one (x, y) micro-batch")
    k, total = len(micro_batches), 0.0
    for i, (x, y) in enumerate(micro_batches):
        if i < k - 1:
            with ddp.no_sync():
                loss = loss_fn(ddp, x, y) / k
                loss.backward()
        else:
            loss = loss_fn(ddp, x, y) / k
            loss.backward()  # the synchronising backward: all_reduce of the summed .grad
        total += loss.item()
    return total


def _check(period, warmup_steps) -> None:
    integer(period, "period"), integer(warmup_steps, "warmup_steps", low=0)
