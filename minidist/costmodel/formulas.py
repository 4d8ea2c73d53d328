"""The first formulas of the cost model: a transformer's parameters, ZeRO's memory per rank,
and a pipeline's bubble. Plain numbers in, plain numbers out, for models and clusters far
larger than this machine; ``tests/costmodel`` checks each against its paper's own figures.
"""

from __future__ import annotations

import numbers


def _count(value, what: str) -> int:
    """A positive whole number, or a ValueError/TypeError that names ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value}")
    return int(value)


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
    n, h = _count(layers, "layers"), _count(hidden, "hidden")
    v, s = _count(vocab, "vocab"), _count(seq, "seq")
    return 12 * n * h * h + 13 * n * h + (v + s) * h


ZERO_STAGES = (0, 1, 2, 3)


def zero_memory(params, dp: int, stage: int, optimizer_bytes=12, param_bytes=2,
                grad_bytes=2) -> dict[str, float]:
    """Bytes of model state per rank in mixed-precision training with ZeRO (Rajbhandari et
    al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020,
    Figure 1 and section 5).

    With Psi parameters: 2 Psi bytes of fp16 parameters, 2 Psi of fp16 gradients and
    K Psi of optimizer states (K = 12 for mixed-precision Adam: fp32 master weights,
    momentum and variance, 4 + 4 + 4 bytes). Over Nd data-parallel ranks, ZeRO shards:

    | stage | params | grads | optimizer | total |
    | --- | --- | --- | --- | --- |
    | 0 (plain data parallel) | 2 Psi | 2 Psi | K Psi | (2 + 2 + K) Psi |
    | 1 (P_os) | 2 Psi | 2 Psi | K Psi / Nd | 4 Psi + K Psi / Nd |
    | 2 (P_os+g) | 2 Psi | 2 Psi / Nd | K Psi / Nd | 2 Psi + (2 + K) Psi / Nd |
    | 3 (P_os+g+p) | 2 Psi / Nd | 2 Psi / Nd | K Psi / Nd | (2 + 2 + K) Psi / Nd |

    The paper's example, Psi = 7.5e9, Nd = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    Returns {"params", "grads", "optimizer", "total"} in bytes (exact quotients; a real
    rank pads its shard to a whole element, as ``md.ZeRO`` does). Activations, buffers and
    fragmentation are not included. ``param_bytes`` and ``grad_bytes`` (2: fp16) change the
    2s of the table: plain fp32 training is param_bytes = grad_bytes = 4 with K = 8 (Adam's
    momentum and variance, the parameters being their own master copy).
    """
    if isinstance(params, bool) or not isinstance(params, numbers.Real) or params <= 0:
        raise ValueError(f"params must be a positive number of parameters, got {params!r}")
    nd = _count(dp, "dp (the number of data-parallel ranks)")
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of 0, 1, 2, 3 (ZeRO's stages), got {stage!r}")
    if isinstance(optimizer_bytes, bool) or not isinstance(optimizer_bytes, numbers.Real) \
            or optimizer_bytes < 0:
        raise ValueError(f"optimizer_bytes (K, bytes of optimizer state per parameter) must "
                         f"be >= 0, got {optimizer_bytes!r}")
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
            raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    out = {"params": float(param_bytes) * params / (nd if stage >= 3 else 1),
           "grads": float(grad_bytes) * params / (nd if stage >= 2 else 1),
           "optimizer": float(optimizer_bytes) * params / (nd if stage >= 1 else 1)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def bubble_fraction(stages: int, microbatches: int, chunks: int = 1) -> float:
    """Share of a pipeline step that a stage sits idle: (p - 1) / (v m + p - 1).

    With p stages, m micro-batches per step and v model chunks per stage (v = 1: GPipe,
    Huang et al. 2019, and 1F1B, PipeDream-Flush; v > 1: Megatron-LM's interleaved
    schedule, Narayanan et al. SC 2021, section 2.2), a step takes the ideal time of its
    m micro-batches, t_id = m (t_f + t_b), plus the bubble, t_pb = (p - 1)(t_f + t_b) / v:
    filling and draining the pipeline. Two ways to state it:

    * this function, the idle share of the step: t_pb / (t_id + t_pb) = (p-1) / (v m + p-1);
      e.g. 4 stages, 8 micro-batches: 3/11 = 27% of the step is bubble.
    * the paper's "bubble time fraction", the bubble over the ideal time:
      t_pb / t_id = (p - 1) / (v m) (:func:`bubble_overhead`), 3/8 in the same example.

    Both go to 0 as m grows; interleaving divides the bubble by v at the price of v times
    as many point-to-point messages.
    """
    p, m = _count(stages, "stages"), _count(microbatches, "microbatches")
    v = _count(chunks, "chunks (model chunks per stage)")
    return (p - 1) / (v * m + p - 1)


def bubble_overhead(stages: int, microbatches: int, chunks: int = 1) -> float:
    """The bubble as a fraction of the ideal step time, (p - 1) / (v m): Narayanan et al.
    (SC 2021)'s "bubble time fraction" (GPipe's (p - 1) / m for v = 1). The share of the
    step that is idle is :func:`bubble_fraction`."""
    p, m = _count(stages, "stages"), _count(microbatches, "microbatches")
    v = _count(chunks, "chunks (model chunks per stage)")
    return (p - 1) / (v * m)


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
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    n = _count(gpus, "gpus")
    per_token = 8 if recompute else 6
    return per_token * tokens * params / (n * flops_per_gpu) / SECONDS_PER_DAY
