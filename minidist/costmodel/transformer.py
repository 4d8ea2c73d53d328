"""A GPT described by its shape: its parameters, the FLOPs of a training step, the days of a
training run. Plain numbers in, plain numbers out, for models far larger than this machine;
``tests/costmodel`` checks each against its paper's own figures.

Parameters: Megatron-LM's count (``transformer_params``). FLOPs, as Narayanan et al.
("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC 2021,
section 5.1 and appendix) count them: with B sequences of s tokens, l layers, hidden h and
vocabulary V, only the matrix products count. One layer's forward is

    24 B s h^2      (Q, K, V and output projections 8 B s h^2; the 4h-wide MLP 16 B s h^2)
    + 4 B s^2 h     (attention scores Q K^T and the weighted sum over V)

and the logit layer's forward 2 B s h V. The backward pass costs twice the forward, so

    no recomputation:   72 B s l h^2 (1 + s / (6h) + V / (12 l h))
    full recomputation: 96 B s l h^2 (1 + s / (6h) + V / (16 l h))    (the paper's formula)

(full recomputation runs every layer's forward again; the logit layer is not recomputed).
Selective recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", 2022) reruns only the attention-score part: + 4 B s^2 h per layer.
Days: Megatron-LM's 8 T P / (n X) (``training_days``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import one_of, positive_int, positive_number


def transformer_params(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Parameters of a GPT-style transformer, as Megatron-LM counts them (Narayanan et al.,
    "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
    SC 2021, the formula for P that sizes the models of its Table 1):

        P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))
          = 12 l h^2 + 13 l h + (V + s) h

    with l layers, hidden size h, vocabulary V and sequence length s. Per layer, 12 h^2
    weights (4 h^2 in attention: Q, K, V and the output projection; 8 h^2 in the MLP of
    width 4h) and 13 h biases and layer-norm parameters; then the token embedding (V h,
    shared with the output layer) and the learned positions (s h). The final layer norm
    (2h) is left out, as in the paper. Their GPT-3 row, l=96, h=12288, V=51200, s=2048,
    gives 174.6e9 (GPT-3's "175B"; Brown et al. 2020 use V=50257).
    """
    n, h = positive_int(layers, "layers", TypeError), positive_int(hidden, "hidden", TypeError)
    v, s = positive_int(vocab, "vocab", TypeError), positive_int(seq, "seq", TypeError)
    return 12 * n * h * h + 13 * n * h + (v + s) * h


RECOMPUTE = ("none", "selective", "full")


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
            positive_int(getattr(self, field), field)
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
    one_of(recompute, RECOMPUTE, "recompute")
    b = positive_int(batch, "batch (sequences per step)")
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


SECONDS_PER_DAY = 86400.0


def training_days(params, tokens, gpus: int, flops_per_gpu, recompute: bool = True) -> float:
    """Days to train ``params`` parameters on ``tokens`` tokens with ``gpus`` GPUs that each
    sustain ``flops_per_gpu`` FLOP/s: Narayanan et al. (SC 2021, section 5.1, equation 4)

        end-to-end time ~ 8 T P / (n X)        (6 T P / (n X) without recomputation)

    since each token costs 6 P FLOPs forward and backward (2 P forward, 4 P backward; Kaplan
    et al. 2020's C = 6 N D) and recomputing the forward adds 2 P. The paper's example:
    GPT-3 (P = 175e9), T = 300e9 tokens, n = 1024 A100s at X = 140 TFLOP/s: 34 days. The
    ``(V + s) / (12 l h)`` and ``s / (6 h)`` terms of the exact count are left out, as in the
    paper (they add ~6% for GPT-3: ``Prediction.days`` uses the exact count).
    """
    for name, value in (("params", params), ("tokens", tokens),
                        ("flops_per_gpu", flops_per_gpu)):
        positive_number(value, name)
    n = positive_int(gpus, "gpus", TypeError)
    per_token = 8 if recompute else 6
    return per_token * tokens * params / (n * flops_per_gpu) / SECONDS_PER_DAY
