"""The training state in a form that does not depend on the world size.

A commit must be restorable on a different number of ranks. DDP's state already is: every
rank holds the whole model and the whole optimizer state. ZeRO's is not: rank r holds
shard r of a flat buffer padded to a multiple of p (``zero/flat_shards.py``), and of the
optimizer state only that shard. So a commit *gathers* the shards into one tensor per
parameter (``all_gather``: (p - 1)/p of the optimizer state moves into every rank, K Psi
bytes in total for K bytes of state per parameter), and a restore *re-shards* it for the
new p: pack the full tensors into the new padded flat buffer and keep shard r.

The form (``FullState``): ``params``, one tensor per parameter in ``module.parameters()``
order; ``buffers``, the module's buffers (replicated under DDP and ZeRO alike); ``optim``,
one dict per parameter of its optimizer state (per-element tensors shaped like the
parameter, scalars such as Adam's ``step`` as they are); ``hyper``, the optimizer's class
and param-group settings (learning rate...). The same form comes out of DDP and
ZeRO, so a commit written by one can be restored into the other.
"""

from __future__ import annotations

from typing import TypedDict

import torch
from torch import nn

from ...collectives import all_gather
from ..data.ddp import DistributedDataParallel
from ..zero.zero_optimizer import ZeRO


class FullState(TypedDict):
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    optim: list[dict[str, torch.Tensor]]
    hyper: list[dict]


def module_of(model: nn.Module) -> nn.Module:
    """The module whose ``parameters()`` the state lists (DDP's and ZeRO's ``module``)."""
    return model.module if isinstance(model, (DistributedDataParallel, ZeRO)) else model


def _hyper(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The param groups' settings; the first one also names the optimizer's class."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    groups[0]["optimizer_class"] = type(optimizer).__name__
    return groups


def _load_hyper(optimizer: torch.optim.Optimizer, hyper: list[dict]) -> None:
    hyper = [dict(g) for g in hyper]
    saved = hyper[0].pop("optimizer_class", None)
    if saved != type(optimizer).__name__:
        raise ValueError(f"the commit holds the state of optimizer {saved}; it cannot be "
                         f"restored into optimizer {type(optimizer).__name__}")
    if len(hyper) != len(optimizer.param_groups):
        raise ValueError(f"the commit has {len(hyper)} optimizer param groups, the optimizer "
                         f"{len(optimizer.param_groups)}: build it the same way")
    for group, saved in zip(optimizer.param_groups, hyper):
        group.update(saved)


@torch.no_grad()
def export_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, comm) -> FullState:
    """The full state of ``model`` and ``optimizer`` (collective when ``model`` is ZeRO)."""
    if isinstance(model, ZeRO):
        return _export_zero(model, comm)
    params = list(module_of(model).parameters())
    optim = [_copy(optimizer.state.get(p, {})) for p in params]
    return FullState(params=[p.detach().clone() for p in params], optim=optim,
                     hyper=_hyper(optimizer), buffers=_buffers(model))


@torch.no_grad()
def import_state(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                 state: FullState) -> None:
    """Load ``state`` into ``model`` and ``optimizer`` (every rank, no communication)."""
    if isinstance(model, ZeRO):
        return _import_zero(model, state)
    params = list(module_of(model).parameters())
    _check_count(len(params), state)
    _load_hyper(optimizer, state["hyper"])
    _load_buffers(model, state["buffers"])
    for p, full, saved in zip(params, state["params"], state["optim"]):
        p.copy_(full)
        optimizer.state[p] = _copy(saved, p.device)


def _buffers(model: nn.Module) -> list[torch.Tensor]:
    """The module's buffers (BatchNorm statistics...): replicated under DDP and ZeRO."""
    return [b.detach().clone() for b in module_of(model).buffers()]


def _load_buffers(model: nn.Module, saved: list[torch.Tensor]) -> None:
    buffers = list(module_of(model).buffers())
    if len(buffers) != len(saved):
        raise ValueError(f"the commit holds {len(saved)} buffers, the model {len(buffers)}: "
                         "restore into the same architecture")
    for b, value in zip(buffers, saved):
        b.copy_(value)


def _copy(saved: dict, device: torch.device | None = None) -> dict:
    """A copy of one parameter's optimizer state; with ``device``, on it, except ``step``,
    which stays where it is (torch's rule in ``Optimizer.load_state_dict``,
    ``_process_value_according_to_param_policy``: the step count lives on the CPU)."""
    def one(k, v):
        if not torch.is_tensor(v):
            return v
        return v.to(device, copy=True) if device is not None and k != "step" else v.clone()
    return {k: one(k, v) for k, v in saved.items()}


def _check_count(n: int, state: FullState) -> None:
    if len(state["params"]) != n:
        raise ValueError(f"the commit holds {len(state['params'])} parameters, the model "
                         f"{n}: restore into the same architecture")


def _export_zero(z: ZeRO, comm) -> FullState:
    """Gather every shard's optimizer state into per-parameter tensors."""
    module_params = list(z.module.parameters())
    index = {id(p): i for i, p in enumerate(module_params)}
    optim: list[dict[str, torch.Tensor]] = [{} for _ in module_params]
    for g, shard in zip(z.groups, z.shards):
        saved = z.optimizer.state.get(shard, {})
        for key in sorted(saved):  # the same order on every rank: the gathers match
            value = saved[key]
            if isinstance(value, torch.Tensor) and value.dim() == 1:
                flat = value if value.numel() == g.padded else \
                    all_gather(comm, value.contiguous()).reshape(-1)
                for p, view in zip(g.params, g.views(flat[:g.numel])):
                    optim[index[id(p)]][key] = view.clone()
            else:  # a scalar (Adam's step), the same on every shard
                for p in g.params:
                    optim[index[id(p)]][key] = value.clone() if torch.is_tensor(value) else value
    return FullState(params=z.full_parameters(), optim=optim, hyper=_hyper(z.optimizer),
                     buffers=_buffers(z))


def _import_zero(z: ZeRO, state: FullState) -> None:
    """Re-shard the full state for this world: pack, keep this rank's slice."""
    module_params = list(z.module.parameters())
    _check_count(len(module_params), state)
    _load_hyper(z.optimizer, state["hyper"])
    _load_buffers(z, state["buffers"])
    index = {id(p): i for i, p in enumerate(module_params)}
    for g, shard in zip(z.groups, z.shards):
        rows = [index[id(p)] for p in g.params]
        flat = g.pack([state["params"][i] for i in rows])
        shard.copy_(flat if shard.numel() == g.padded else g.shard_of(flat))
        if z.stage < 3:  # the module's parameters are views of the whole flat buffer
            for p, full in zip(g.params, [state["params"][i] for i in rows]):
                p.copy_(full)
        saved = state["optim"][rows[0]]
        new: dict[str, torch.Tensor] = {}
        for key, value in saved.items():
            if torch.is_tensor(value) and value.dim() >= 1:
                packed = g.pack([state["optim"][i][key] for i in rows])
                new[key] = (packed if shard.numel() == g.padded else g.shard_of(packed)).clone()
            else:
                new[key] = value.clone() if torch.is_tensor(value) else value
        z.optimizer.state[shard] = new
