"""A plain multilayer perceptron, for the simplest demos and for benchmarks whose cost is all
in matrix products (``minidist bench ddp``)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int, depth: int, classes: int = 10, in_features: int | None = None,
        seed: int | None = None) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` with ReLU, then a linear head of ``classes``.

    ``in_features`` defaults to ``width``. With ``seed`` the weights are the same on every
    call and every rank (1024 x 5: 5.26 M parameters, 21 MB of float32).
    """
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    n_in = width if in_features is None else in_features
    for _ in range(depth):
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    return nn.Sequential(*layers, nn.Linear(n_in, classes))
