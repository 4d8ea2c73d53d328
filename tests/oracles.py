"""Single-process reference training, shared by every strategy's equivalence tests.

A distributed strategy is correct when it trains like one process on the whole batch: the
same losses and, within a stated tolerance, the same parameters. Each strategy's test runs
its ranks with ``train_steps(..., rank=comm.rank, world=comm.world_size)`` (or its own loop),
compares with ``train_single`` and checks that the replicas agree bit for bit::

    from oracles import assert_params_close, assert_replicas_bitwise, params_of, train_single

    def _rank(comm):
        ddp = md.DistributedDataParallel(make_model(), comm)
        train_steps(ddp, data, rank=comm.rank, world=comm.world_size, lr=0.1)
        assert_replicas_bitwise(comm, ddp.module)
        return params_of(ddp.module)

    want = train_single(make_model, data, lr=0.1).params
    for got in md.launch(_rank, 2):
        assert_params_close(got, want, atol=1e-13)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import minidist as md


def mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default loss: ``F.mse_loss(model(x), y)`` (a mean over the batch, so averaging
    the ranks' gradients equals one process's gradient on the whole batch)."""
    return F.mse_loss(model(x), y)


class Reference(NamedTuple):
    losses: list[float]
    params: dict[str, torch.Tensor]


def train_steps(model: nn.Module, batches: Sequence[tuple], optimizer_class=torch.optim.SGD,
                *, rank: int = 0, world: int = 1, loss_fn: Callable = mse,
                **opt_kwargs) -> list[float]:
    """One optimizer step per ``(x, y)`` batch, on this rank's slice of it (``x.chunk(world)
    [rank]``; the whole batch with the defaults); returns this rank's losses. ``loss_fn(model,
    x, y)`` computes the loss. ``model`` may be a wrapper (DDP) or the plain module."""
    opt = optimizer_class(model.parameters(), **opt_kwargs)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(model, x.chunk(world)[rank], y.chunk(world)[rank])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_single(model_fn: Callable[[], nn.Module], batches: Sequence[tuple],
                 steps: int | None = None, optimizer_class=torch.optim.SGD, *,
                 loss_fn: Callable = mse, **opt_kwargs) -> Reference:
    """The reference: ``model_fn()`` trained by one process on whole batches, ``steps`` of
    them (all by default). Returns ``Reference(losses, params)``."""
    model = model_fn()
    data = list(batches)[:steps] if steps is not None else list(batches)
    losses = train_steps(model, data, optimizer_class, loss_fn=loss_fn, **opt_kwargs)
    return Reference(losses, params_of(model))


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of the parameters, by name, in ``model.parameters()`` order."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _named(params) -> tuple[list[tuple[str, torch.Tensor]], bool]:
    """(name, tensor) pairs, and whether the names are real (a module or a dict)."""
    if isinstance(params, nn.Module):
        params = params_of(params)
    if isinstance(params, Mapping):
        return list(params.items()), True
    return [(f"parameter {i}", t) for i, t in enumerate(params)], False


def assert_params_close(got, want, atol: float, rtol: float = 0.0) -> None:
    """Every parameter of ``got`` within ``atol + rtol * |want|`` of ``want`` (modules, dicts
    by name or lists in ``parameters()`` order). The message names the parameter, the
    largest difference and where it is."""
    (g, g_named), (w, w_named) = _named(got), _named(want)
    assert len(g) == len(w), f"{len(g)} parameters, expected {len(w)}"
    for (gname, gt), (wname, wt) in zip(g, w):
        if g_named and w_named and gname != wname:
            raise AssertionError(f"parameter {gname!r} where {wname!r} was expected")
        name = wname if w_named else gname
        gt, wt = gt.detach().cpu(), wt.detach().cpu()
        assert gt.shape == wt.shape, \
            f"{name}: shape {tuple(gt.shape)}, expected {tuple(wt.shape)}"
        if not gt.numel():
            continue
        diff = (gt.double() - wt.double()).abs().reshape(-1)
        excess = (diff - (atol + rtol * wt.double().abs().reshape(-1))).nan_to_num(nan=1.0)
        worst = int(excess.argmax())
        if excess[worst] > 0:
            where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), gt.shape))
            raise AssertionError(
                f"{name}: largest difference {diff.max().item():.3g}; worst at {where}: got "
                f"{gt.reshape(-1)[worst].item()!r}, want {wt.reshape(-1)[worst].item()!r} "
                f"(allowed: atol={atol:g}, rtol={rtol:g})")


def _digest(t: torch.Tensor) -> int:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    head = hashlib.sha256(str((t.dtype, tuple(t.shape))).encode() + raw).digest()[:8]
    return int.from_bytes(head, "little", signed=True)


def assert_replicas_bitwise(comm, model) -> None:
    """Collective (call it on every rank): every rank holds bitwise the same parameters.
    Each rank gathers a digest per parameter from all ranks; on a mismatch every rank raises
    the same AssertionError naming the first parameter and the ranks that differ."""
    named, _ = _named(model)
    mine = torch.tensor([_digest(t) for _, t in named], dtype=torch.int64,
                        device=getattr(comm, "device", "cpu"))  # NCCL gathers CUDA only
    table = md.all_gather(comm, mine)  # (world_size, number of parameters)
    for j, (name, _) in enumerate(named):
        column = table[:, j]
        differ = [r for r in range(comm.world_size) if column[r] != column[0]]
        if differ:
            raise AssertionError(f"replicas differ: {name!r} on rank(s) {differ} is not "
                                 "bitwise equal to rank 0's")
