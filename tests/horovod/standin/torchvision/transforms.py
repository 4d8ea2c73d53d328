"""``Compose``, ``ToTensor`` and ``Normalize`` on uint8 image tensors (what the stand-in
``datasets.MNIST`` yields)."""

from __future__ import annotations

import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    """uint8 HxW -> float 1xHxW in [0, 1]."""

    def __call__(self, img):
        x = torch.as_tensor(img).float().div(255)
        return x.unsqueeze(0) if x.dim() == 2 else x


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean), torch.tensor(std)

    def __call__(self, x):
        return (x - self.mean.view(-1, 1, 1)) / self.std.view(-1, 1, 1)
