"""A stand-in for torchvision, for the tests only: torchvision's wheel does not load
against the CPU torch here (``operator torchvision::nms does not exist``), and Horovod's
example scripts import it. ``models`` builds ResNets with torchvision's layer layout (He et
al., "Deep Residual Learning for Image Recognition", CVPR 2016; the same parameter counts,
checked in tests/horovod/test_standin.py); ``datasets.MNIST`` generates images instead of
downloading them; ``transforms`` has the three the MNIST example uses."""

from . import datasets, models, transforms

__all__ = ["datasets", "models", "transforms"]
