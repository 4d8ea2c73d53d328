"""One flat, padded buffer for a group of parameters, cut into one equal shard per rank.

ZeRO (Rajbhandari et al., SC 2020) never shards a tensor by its shape: it lays the
parameters of a group end to end in one 1-D buffer, pads the buffer with zeros to a
multiple of the world size p, and gives rank r the r-th of p equal pieces::

    params    [ w0 (6) | b0 (2) | w1 (4) ]           numel = 12, p = 5
    flat      [ w0 w0 w0 w0 w0 w0 b0 b0 w1 w1 w1 w1 0 0 0 ]   padded = 15
    shards      rank 0 | rank 1 | rank 2 | rank 3 | rank 4      3 elements each

Equal pieces are what ``reduce_scatter`` and ``all_gather`` move, so no rank waits for a
longer piece and the shard boundaries are ``r * padded / p`` (never ``r * numel / p``:
without the padding the last rank's piece would be short and the pieces would not line
up with what the collectives deliver). A shard may start inside one tensor and end inside
another: ZeRO's optimizer does not care, because it treats its shard as one flat
parameter (see ``zero_optimizer.py`` for which optimizers that is exact for). The padding
is at most p - 1 elements per group, always zero, and never read back into a parameter.

FSDP (Zhao et al., VLDB 2023) calls the same thing a ``FlatParameter``: one per wrapped
unit, which is what stage 3 uses here (one group per unit, ``param_units.py``).

Below the layout, the few moves every stage makes between a module and its flat buffers:
``flat_parameters`` (the parameters become views of one buffer per group, so that writing
the buffer, an all-gather, updates the module in place), ``flat_gradients``,
``point_grads_at`` and ``take_grads`` (the same for the full gradients of stages 0 and 1),
``group_parameters`` and ``storage_bytes`` (what a rank really holds).
"""

from __future__ import annotations

import torch
from torch import nn


class FlatShards:
    """The layout of one group: where each parameter lies in the padded flat buffer and
    which slice of it each rank owns. Holds no data itself: ``pack`` and ``views`` move
    between the parameters' shapes and flat buffers that the caller owns."""

    def __init__(self, params: list[nn.Parameter], world_size: int, rank: int, index: int = 0):
        if not params:
            raise ValueError("a FlatShards group needs at least one parameter")
        dtypes = {p.dtype for p in params}
        devices = {p.device for p in params}
        if len(dtypes) > 1 or len(devices) > 1:
            raise TypeError("ZeRO flattens the parameters of a group into one buffer, so they "
                            "must share one dtype and device; got dtypes "
                            f"{sorted(map(str, dtypes))} and devices {sorted(map(str, devices))}. "
                            "Convert the model first (e.g. model.double())")
        self.index, self.params, self.rank, self.world_size = index, params, rank, world_size
        self.sizes = [p.numel() for p in params]
        self.shapes = [p.shape for p in params]  # kept: stage 3 empties the parameters
        self.offsets = [sum(self.sizes[:i]) for i in range(len(params))]
        self.numel = sum(self.sizes)
        self.padded = -(-self.numel // world_size) * world_size  # round up to a multiple of p
        self.shard_numel = self.padded // world_size
        self.dtype, self.device = params[0].dtype, params[0].device

    @property
    def padding(self) -> int:
        """Zeros at the end of the flat buffer (< world size)."""
        return self.padded - self.numel

    def bounds(self, rank: int | None = None) -> tuple[int, int]:
        """``[start, end)`` of ``rank``'s shard (this rank's by default) in the flat buffer."""
        r = self.rank if rank is None else rank
        return r * self.shard_numel, (r + 1) * self.shard_numel

    def empty(self) -> torch.Tensor:
        """A new zero flat buffer of the padded length."""
        return torch.zeros(self.padded, dtype=self.dtype, device=self.device)

    def pack(self, tensors: list[torch.Tensor | None], out: torch.Tensor | None = None,
             scale: float = 1.0) -> torch.Tensor:
        """Lay ``tensors`` (one per parameter, ``None`` for zeros) end to end in ``out`` (a
        new buffer by default), times ``scale``; the padding is zero. Returns ``out``."""
        out = self.empty() if out is None else out
        for t, off, n in zip(tensors, self.offsets, self.sizes):
            dst = out[off:off + n]
            if t is None:
                dst.zero_()
            elif scale == 1.0:
                dst.copy_(t.reshape(-1))
            else:
                torch.mul(t.reshape(-1), scale, out=dst)
        out[self.numel:].zero_()
        return out

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` shaped like each parameter (they share its memory)."""
        return [flat[off:off + n].view(shape)
                for shape, off, n in zip(self.shapes, self.offsets, self.sizes)]

    def shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full flat buffer (a view)."""
        start, end = self.bounds()
        return flat[start:end]

    def __repr__(self) -> str:
        return (f"FlatShards({self.index}: {len(self.params)} params, numel={self.numel}, "
                f"padded={self.padded}, shard={self.shard_numel} x {self.world_size})")


def flat_parameters(groups: list[FlatShards]) -> list[torch.Tensor]:
    """One new flat buffer per group, holding its parameters' values, with the parameters
    made views of it (``point_params_at``)."""
    flats = [g.empty() for g in groups]
    for g, flat in zip(groups, flats):
        point_params_at(g, flat)
    return flats


def flat_gradients(groups: list[FlatShards]) -> list[torch.Tensor]:
    """One zero flat gradient buffer per group, every ``param.grad`` a view of it: autograd
    then accumulates the gradients in place, straight into the buffer a collective reads."""
    flats = [g.empty() for g in groups]
    for g, flat in zip(groups, flats):
        point_grads_at(g, flat)
    return flats


def point_grads_at(group: FlatShards, flat: torch.Tensor) -> None:
    """Make every ``param.grad`` of ``group`` a view of ``flat`` (values not copied)."""
    for p, view in zip(group.params, group.views(flat)):
        p.grad = view


def take_grads(group: FlatShards, flat: torch.Tensor) -> torch.Tensor:
    """``flat``, made to hold the group's gradients: a ``param.grad`` that someone replaced
    since ``point_grads_at`` (a new tensor, or None for zeros) is copied in and pointed back
    at its view, so the buffer never silently misses a gradient. Returns ``flat``."""
    for p, view in zip(group.params, group.views(flat)):
        if p.grad is None or p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad) if p.grad is not None else view.zero_()
            p.grad = view
    return flat


def point_params_at(group: FlatShards, flat: torch.Tensor) -> None:
    """Make every parameter of ``group`` a view of ``flat`` (its values copied in first), so
    that writing the flat buffer (an all-gather) updates the module's parameters in place."""
    with torch.no_grad():
        group.pack([p.detach() for p in group.params], out=flat)
        for p, view in zip(group.params, group.views(flat)):
            p.data = view


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``: what this process actually holds
    (a view and its base count once; a freed storage counts 0)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def group_parameters(params: list[nn.Parameter], groups: list[list[int]], world_size: int,
                     rank: int) -> list[FlatShards]:
    """One ``FlatShards`` per list of parameter indices (each kept in registration order)."""
    return [FlatShards([params[i] for i in sorted(idx)], world_size, rank, index=k)
            for k, idx in enumerate(groups)]
