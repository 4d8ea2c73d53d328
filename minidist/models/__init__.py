"""Small deterministic models that lessons, tests and benchmarks share: a plain MLP and a
nanoGPT-shaped GPT with a character-level dataset that needs no download."""

from .gpt import GPT, GPTConfig, lm_loss
from .mlp import mlp
from .text import CharText, synthetic_tokens

__all__ = ["GPT", "GPTConfig", "CharText", "lm_loss", "mlp", "synthetic_tokens"]
