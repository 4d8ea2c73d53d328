"""A GPT described by its shape only (nothing allocated), and the FLOPs of one training step.

The count is Narayanan et al.'s ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC 2021, section 5.1 and appendix): with B sequences of s
tokens, l layers, hidden h and vocabulary V, only the matrix products count. One layer's
forward is

    24 B s h^2      (Q, K, V and output projections 8 B s h^2; the 4h-wide MLP 16 B s h^2)
    + 4 B s^2 h     (attention scores Q K^T and the weighted sum over V)

and the logit layer's forward 2 B s h V. The backward pass costs twice the forward, so

    no recomputation:   72 B s l h^2 (1 + s / (6h) + V / (12 l h))
    full recomputation: 96 B s l h^2 (1 + s / (6h) + V / (16 l h))    (the paper's formula)

(full recomputation runs every layer's forward again; the logit layer is not recomputed).
Selective recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", 2022) reruns only the attention-score part: + 4 B s^2 h per layer.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .formulas import transformer_params

RECOMPUTE = ("none", "selective", "full")


def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GPTShape:
    """A GPT-style transformer: ``layers`` blocks of ``hidden`` width with ``heads``
    attention heads, a ``vocab``-token embedding shared with the output layer (unless
    ``tied=False``: a separate V x h head), learned positions for ``seq`` tokens.
    ``params`` is Megatron-LM's count (plus V h when untied)."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    name: str = ""
    tied: bool = True

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "vocab", "seq"):
            _positive(getattr(self, field), field)
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by heads={self.heads} "
                             "(each head gets hidden / heads dimensions)")

    @property
    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return transformer_params(self.layers, self.hidden, self.vocab, self.seq) + head

    @classmethod
    def from_config(cls, config, name: str = "") -> GPTShape:
        """The shape of ``md.models.GPT(config)`` (a ``GPTConfig``); its parameters are
        ``params`` + 2h (the final LayerNorm, which Megatron's count leaves out)."""
        return cls(config.n_layer, config.n_embd, config.n_head, config.vocab_size,
                   config.block_size, name, config.tie_weights)

    def step_flops(self, batch: int, recompute: str = "none") -> float:
        """FLOPs of one training step on ``batch`` sequences (module docstring)."""
        return step_flops(self, batch, recompute)


def step_flops(model: GPTShape, batch: int, recompute: str = "none") -> float:
    """FLOPs of forward and backward (and the recomputed forward) for ``batch`` sequences:
    3 passes of every layer's matrix products (4 with ``"full"`` recomputation; 4 of the
    attention-score products with ``"selective"``) and 3 of the logit layer."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    b = _positive(batch, "batch (sequences per step)")
    s, h, n, v = model.seq, model.hidden, model.layers, model.vocab
    dense, scores = 24 * b * s * h * h, 4 * b * s * s * h  # one layer's forward
    dense_passes = 4 if recompute == "full" else 3
    score_passes = 3 if recompute == "none" else 4
    return float(n * (dense_passes * dense + score_passes * scores) + 6 * b * s * h * v)


def model_flops(model: GPTShape, batch: int) -> float:
    """The FLOPs a step needs, without recomputation: the numerator of model FLOPs
    utilization (MFU, Chowdhery et al., PaLM, 2022), which recomputation does not raise."""
    return step_flops(model, batch, "none")


# Narayanan et al. (2021), the model they estimate training time for (section 5.1): GPT-3's
# shape (Brown et al. 2020) with Megatron's vocabulary of 51200 (GPT-3 itself used 50257).
GPT3_175B = GPTShape(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048,
                     name="GPT-3 175B")
