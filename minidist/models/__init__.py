"""Small deterministic models that lessons, tests and benchmarks share."""

from .mlp import mlp

__all__ = ["mlp"]
