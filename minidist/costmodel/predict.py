"""Predicted step time and memory per GPU of a plan: ``predict(model, cluster, plan)``.

Notation: l layers, hidden h, a heads, sequence s, vocabulary V, Psi parameters; the plan's
dp, pp, tp, m micro-batches of b sequences, v chunks per stage, B = dp m b sequences per step,
N = dp pp tp GPUs sustaining X FLOP/s each; e bytes per value at the plan's precision.

Time (nothing overlaps anything: an upper bound where real systems hide some of the dp and
pp traffic behind computation), each part from the module that derives it:

* compute = F / (N X), F = ``step_flops(model, B, recompute)`` (72 B s l h^2 (1 + s/6h +
  V/12lh); 96 B s l h^2 (1 + s/6h + V/16lh) with full recomputation; ``transformer.py``);
* tp (``tp.tp_time``): the all-reduces of the last pipeline stage, m times: per micro-batch
  4 per layer of its l/pp (6 with full recomputation), the head's and, without a pipeline,
  the embedding's, all of e b s h bytes, and the cross-entropy's 3 of e b s bytes:
  m [(4 l/pp + 1 + [pp = 1]) ring(e b s h, tp) + 3 ring(e b s, tp)], counted on the code;
* pp (``pp.pp_time``): an activation forward and a gradient back per chunk boundary and
  micro-batch, 2 v m (alpha + e b s h / (tp beta) + all_gather(e b s h / tp, tp)) with
  Megatron's scatter/gather, 2 v m (alpha + e b s h / beta) without;
* bubble = (p - 1) / (v m) x (compute + tp + pp) (``pp.bubble_overhead``): the fill and the
  drain are p - 1 slots of one micro-batch's forward and backward, its tp all-reduces and
  its transfers included;
* dp (``dp.dp_time``): one ring all-reduce of the e Psi / (pp tp) gradient bytes per step
  after the flush; ZeRO 1-2 reduce-scatter then all-gather (the same bytes), ZeRO-3 gathers
  once more (1.5x).

Memory per GPU: ``zero_memory`` of Psi / (pp tp) parameters (e bytes each for parameters
and gradients; K = 12 optimizer bytes in mixed precision, 8 in fp32) plus the activations
of Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models",
2022, table 2), per layer and micro-batch, for 2-byte activations:

    no recomputation:        s b h (10 + 24/tp + 5 a s / (h tp))  (34/tp + ... with SP)
    selective recomputation: s b h (10 + 24/tp)                   (34/tp with SP)
    full recomputation:      2 s b h                              (2 s b h / tp with SP)

times the layers the first stage holds under 1F1B: (l/pp) min(pp, m) (= l once m >= pp), or
l (1 + (pp - 1) / (pp v)) interleaved. Embedding, logits and buffers are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import PRECISION_BYTES, Cluster, crossing_dims
from .dp import dp_time
from .plan import Plan
from .pp import bubble_overhead, pp_time
from .tp import tp_time
from .transformer import SECONDS_PER_DAY, GPTShape, model_flops, step_flops
from .zero import zero_memory

OPTIMIZER_BYTES = {"fp32": 8, "bf16": 12, "fp16": 12}  # K: Adam's m, v (+ fp32 master)
TIME_PARTS = ("compute_s", "tp_s", "pp_s", "bubble_s", "dp_s")


def layer_activation_bytes(model: GPTShape, plan: Plan) -> float:
    """Bytes one layer keeps for backward per micro-batch (Korthikanti et al., table 2)."""
    s, b, h, a, t = model.seq, plan.micro_batch_size, model.hidden, model.heads, plan.tp
    if plan.recompute == "full":
        per = 2 * s * b * h / (t if plan.sequence_parallel else 1)
    else:
        scores = 0.0 if plan.recompute == "selective" else 5 * a * s / (h * t)
        rest = 34 / t if plan.sequence_parallel else 10 + 24 / t
        per = s * b * h * (rest + scores)
    return per * PRECISION_BYTES[plan.precision] / 2


def activation_bytes(model: GPTShape, plan: Plan) -> float:
    """Activation bytes the first pipeline stage holds at its peak (module docstring)."""
    p, m, v = plan.pp, plan.microbatches, plan.chunks
    layers = model.layers / p * min(p, m) if v == 1 else model.layers * (1 + (p - 1) / (p * v))
    return layer_activation_bytes(model, plan) * layers


def memory_bytes(model: GPTShape, plan: Plan) -> dict[str, float]:
    """{"params", "grads", "optimizer", "activations", "total"}: bytes per GPU."""
    e = PRECISION_BYTES[plan.precision]
    state = zero_memory(model.params / (plan.pp * plan.tp), plan.dp, plan.zero_stage,
                        optimizer_bytes=OPTIMIZER_BYTES[plan.precision], param_bytes=e,
                        grad_bytes=e)
    out = {k: state[k] for k in ("params", "grads", "optimizer")}
    out["activations"] = activation_bytes(model, plan)
    out["total"] = sum(out.values())
    return out


def step_times(model: GPTShape, cluster: Cluster, plan: Plan) -> dict[str, float]:
    """Seconds of one step by part: compute, tp, pp, bubble, dp (module docstring)."""
    flops = step_flops(model, plan.global_batch, plan.recompute)
    compute = flops / (plan.gpus * cluster.flops(plan.precision))
    tp, pp = tp_time(model, cluster, plan), pp_time(model, cluster, plan)
    bubble = bubble_overhead(plan.pp, plan.microbatches, plan.chunks) * (compute + tp + pp)
    return {"compute_s": compute, "tp_s": tp, "pp_s": pp, "bubble_s": bubble,
            "dp_s": dp_time(model, cluster, plan)}


@dataclass(frozen=True, eq=False)
class Prediction:
    """What ``predict`` says about one plan: ``times`` (seconds by part, ``TIME_PARTS``)
    and ``memory`` (bytes per GPU by part), with the figures papers report."""

    model: GPTShape
    cluster: Cluster
    plan: Plan
    times: dict
    memory: dict

    @property
    def step_s(self) -> float:
        return sum(self.times.values())

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.cluster.memory

    @property
    def crossing(self) -> str:
        """The dimensions whose groups span nodes, e.g. "dp,pp"; "-" if none."""
        layout = (self.plan.dp, self.plan.pp, self.plan.tp)
        return ",".join(crossing_dims(layout, self.cluster.per_node)) or "-"

    def row(self) -> dict:
        """The plan's layout, memory (model state, activations, total) and times, flat."""
        state = sum(self.memory[k] for k in ("params", "grads", "optimizer"))
        return {"dp": self.plan.dp, "pp": self.plan.pp, "tp": self.plan.tp,
                "microbatches": self.plan.microbatches, "state_bytes": state,
                "activation_bytes": self.memory["activations"],
                "memory_bytes": self.memory["total"], "fits": self.fits, **self.times,
                "step_s": self.step_s, "crossing": self.crossing}

    @property
    def tokens_per_s(self) -> float:
        return self.plan.global_batch * self.model.seq / self.step_s

    @property
    def tflops_per_gpu(self) -> float:
        """Megatron-LM's "teraFLOP/s per GPU": the FLOPs executed (recomputation included)
        per second per GPU."""
        flops = step_flops(self.model, self.plan.global_batch, self.plan.recompute)
        return flops / (self.plan.gpus * self.step_s) / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: model FLOPs (no recomputation) / (N x peak x time)."""
        peak = self.cluster.peak_flops[self.plan.precision]
        return model_flops(self.model, self.plan.global_batch) / (
            self.plan.gpus * peak * self.step_s)

    def days(self, tokens: float) -> float:
        """Days to train on ``tokens`` tokens at this step time."""
        return tokens / self.tokens_per_s / SECONDS_PER_DAY

    def summary(self) -> str:
        parts = ", ".join(f"{k[:-2]} {v:.3g}" for k, v in self.times.items())
        mem = ", ".join(f"{k} {v / 1e9:.3g}" for k, v in self.memory.items())
        return (f"{self.plan}: step {self.step_s:.4g} s ({parts}); GB per GPU: {mem} "
                f"({'fits' if self.fits else 'does not fit'} in "
                f"{self.cluster.memory / 1e9:.3g}); {self.tflops_per_gpu:.0f} TFLOP/s per "
                f"GPU, MFU {self.mfu:.0%}")


def predict(model: GPTShape, cluster: Cluster, plan: Plan) -> Prediction:
    """Step time and memory per GPU of ``plan`` for ``model`` on ``cluster``."""
    plan.check(model, cluster)
    return Prediction(model, cluster, plan, step_times(model, cluster, plan),
                      memory_bytes(model, plan))
