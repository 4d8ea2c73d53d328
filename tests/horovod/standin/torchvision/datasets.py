"""``MNIST`` without the download: seeded random 28x28 images whose label is a simple
function of the pixels (the brightest of ten horizontal bands), so a network can learn
it and the loss falls."""

from __future__ import annotations

import torch


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root=None, train: bool = True, download: bool = False,
                 transform=None, size: int | None = None):
        n = size if size is not None else (1024 if train else 256)
        g = torch.Generator().manual_seed(0 if train else 1)
        images = torch.rand(n, 28, 28, generator=g) * 0.3
        labels = torch.randint(0, 10, (n,), generator=g)
        for i, y in enumerate(labels.tolist()):  # band y (rows 2y+4 .. 2y+5) lit up
            images[i, 2 * y + 4: 2 * y + 6] += 0.7
        self.data, self.targets, self.transform = (images * 255).to(torch.uint8), labels, \
            transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        img = self.data[i]
        return (self.transform(img) if self.transform else img), int(self.targets[i])
