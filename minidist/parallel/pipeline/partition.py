"""Cutting a model into pipeline stages, and reporting what each stage holds and costs.

A pipeline runs at the pace of its slowest stage: with stage times t_1..t_p the step takes
about (m + p - 1) max_r t_r, so the cut should make the heaviest stage as light as possible
(the seed's "balance the load"). Three measures of a layer's weight:

* ``by="layers"``: every layer weighs the same (equal layer counts per stage);
* ``by="params"``: its parameter count (balances the memory of weights and optimizer state);
* ``by="cost"``: its measured forward + backward time on a sample batch (balances time).

:func:`partition` then finds the contiguous cut that minimises the heaviest stage, by dynamic
programming over (layers, stages): O(n^2 p) for n layers, instant for any real model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from ...checks import one_of
from .measure import SavedBytes

SPLIT_BY = ("layers", "params", "cost")


def partition(weights: Sequence[float], stages: int) -> list[int]:
    """Boundaries ``b`` (``len(b) == stages + 1``) so that stage r holds layers
    ``b[r]:b[r + 1]``, each stage at least one layer, the heaviest stage as light as can be."""
    n = len(weights)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= n:
        raise ValueError(f"stages must be between 1 and the number of layers ({n}), "
                         f"got stages={stages!r}")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    inf = float("inf")
    # best[k][j]: the lightest heaviest stage when the first j layers form k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return bounds[::-1]


def _layers(model) -> list[nn.Module]:
    if hasattr(model, "stages") and callable(model.stages):
        return list(model.stages())  # md.models.GPT: [Embedding, Block..., Head]
    if isinstance(model, (nn.Sequential, list, tuple)):
        return list(model)
    raise TypeError(f"model must be an nn.Sequential, a list of modules or have .stages(), "
                    f"got {type(model).__name__}")


def layer_costs(layers: Sequence[nn.Module], sample: torch.Tensor,
                repeats: int = 3) -> list[float]:
    """Seconds of forward + backward of each layer on ``sample`` (fed through the layers
    before it), the best of ``repeats`` runs."""
    costs, x = [], sample
    for layer in layers:
        best = float("inf")
        for _ in range(repeats):
            inp = x.detach().requires_grad_(x.is_floating_point())
            start = time.perf_counter()
            out = layer(inp)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
            best = min(best, time.perf_counter() - start)
        layer.zero_grad(set_to_none=True)
        costs.append(best)
        x = out.detach()
    return costs


def _check_untied(parts: list[nn.Sequential]) -> None:
    owner: dict[int, int] = {}
    for r, part in enumerate(parts):
        for p in part.parameters():
            if owner.setdefault(id(p), r) != r:
                raise ValueError(f"a parameter is shared by stages {owner[id(p)]} and {r} "
                                 f"(tied weights, e.g. GPT's head and embedding): build the "
                                 f"model untied (GPTConfig(tie_weights=False)) or cut so "
                                 f"both users are on one stage")


def split_model(model, stages: int, by: str = "layers",
                sample: torch.Tensor | None = None) -> list[nn.Sequential]:
    """Cut ``model`` (``nn.Sequential``, list of modules, or a GPT via ``.stages()``) into
    ``stages`` contiguous ``nn.Sequential`` parts, balanced ``by`` "layers", "params" or
    "cost" (``sample`` needed: a batch for the first layer). The parts share the model's
    parameters; stage r runs ``parts[r]``."""
    layers = _layers(model)
    one_of(by, SPLIT_BY, "by")
    if by == "layers":
        weights: list[float] = [1.0] * len(layers)
    elif by == "params":
        weights = [float(sum(p.numel() for p in layer.parameters())) for layer in layers]
    else:
        if sample is None:
            raise ValueError("by='cost' measures each layer: pass sample=<a batch>")
        weights = layer_costs(layers, sample)
    bounds = partition(weights, stages)
    parts = [nn.Sequential(*layers[a:b]) for a, b in zip(bounds, bounds[1:])]
    _check_untied(parts)
    return parts


def stage_report(parts: Sequence[nn.Module], sample: torch.Tensor,
                 repeats: int = 3) -> list[dict]:
    """Per stage: its layers, parameters, the activation bytes one forward on ``sample``
    keeps for backward, the output shape, and the measured forward + backward seconds."""
    rows, x = [], sample
    for r, part in enumerate(parts):
        params = {p.data_ptr() for p in part.parameters()}
        with SavedBytes(params) as saved:
            out = part(x.detach().requires_grad_(x.is_floating_point()))
        seconds = sum(layer_costs([part], x, repeats))
        part.zero_grad(set_to_none=True)
        rows.append({"stage": r, "layers": len(part) if hasattr(part, "__len__") else 1,
                     "params": sum(p.numel() for p in part.parameters()),
                     "activation_bytes": saved.bytes, "output_shape": tuple(out.shape),
                     "seconds": seconds})
        x = out.detach()
    return rows
