"""What a dp x pp x tp layout costs a large GPT on a described cluster, as code: memory per
GPU, and the step time split into compute, bubble and the three dimensions' communication.
The PTD-P analysis of Narayanan et al. ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC 2021, sections 3 and 5), with ``md.costmodel``'s formulas.

N = dp pp tp GPUs, Psi parameters (``transformer_params``), l layers, hidden h, a heads,
sequence s, vocabulary V, global batch B sequences in micro-batches of b, so each pipeline
runs m = B / (dp b) micro-batches per step. Per GPU (mixed precision, 2-byte activations):

* state: ``zero_memory(Psi / (pp tp), dp, stage)``: each GPU holds 1/(pp tp) of the model,
  16 bytes per parameter for Adam, ZeRO dividing by dp;
* activations (Korthikanti et al. 2022, tensor parallel without sequence parallelism):
  s b h (10 + 24/tp + 5 a s / (h tp)) bytes per layer per micro-batch; with 1F1B the first
  stage keeps min(pp, m) micro-batches of its l/pp layers;
* compute: F = 72 B s l h^2 (1 + s / (6 h) + V / (12 l h)) FLOPs per step (forward and
  backward; the paper's 96 counts activation recomputation), t = F / (N X) at X FLOP/s
  per GPU; the bubble adds t (pp - 1) / m (``bubble_overhead``);
* tp: 4 all-reduces of b s h 2 bytes per layer per micro-batch, on the critical path:
  4 (l / pp) m ring_time(2 b s h, tp);
* pp: one activation forward and one gradient back per micro-batch, 2 m (alpha + 2 b s h /
  beta) (Megatron's scatter/gather would divide the bytes by tp; not done here);
* dp: one ring all-reduce of the 2 Psi / (pp tp) gradient bytes per step, not overlapped
  (ZeRO 1 and 2 move the same bytes, 1.5x for stage 3).

``md.costmodel`` (``predict``, ``search_plans``) is the fuller model (ZeRO stages,
recomputation, sequence parallelism, interleaving, precisions); this module keeps the
layout sweep the hybrid lesson and ``minidist bench hybrid`` use.

Each dimension's link is the cluster's slowest one its groups cross: with the mesh row-major
and rank r on node r // per_node, tp (last, adjacent ranks) stays inside a node whenever
tp <= per_node, and dp (first, ranks N/dp apart) crosses nodes first: the PTD-P rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..collectives import costs as collective_costs
from ..costmodel import GPTShape, Plan, bubble_overhead, zero_memory
from ..costmodel import activation_bytes as costmodel_activation_bytes
from ..costmodel import step_flops as costmodel_step_flops
from ..costmodel.planner import layouts
from ..transports.network import Link
from .mesh import groups

LargeGPT = GPTShape  # a transformer described by its shape only (``md.costmodel``)


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``per_node`` GPUs; ``flops``: achieved FLOP/s per GPU;
    ``memory``: bytes per GPU."""
    nodes: int
    per_node: int
    intra: Link
    inter: Link
    flops: float
    memory: float
    name: str = ""

    @property
    def gpus(self) -> int:
        return self.nodes * self.per_node


def crosses_nodes(layout: tuple[int, int, int], dim: str, per_node: int) -> bool:
    """Whether a group along ``dim`` of the row-major {"dp", "pp", "tp"} mesh spans nodes."""
    shape = dict(zip(("dp", "pp", "tp"), layout))
    return any(len({r // per_node for r in g}) > 1 for g in groups(shape, dim))


def _ring(nbytes: float, p: int, link: Link) -> float:
    return 0.0 if p == 1 else collective_costs.ring_time(nbytes, p, link.alpha, link.bandwidth)


def activation_bytes(model: GPTShape, tp: int, pp: int, m: int, microbatch: int) -> float:
    """Bytes of activations the first pipeline stage keeps under 1F1B (Korthikanti et al.;
    ``md.costmodel.activation_bytes`` of the same plan)."""
    plan = Plan(pp=pp, tp=tp, microbatches=m, micro_batch_size=microbatch)
    return costmodel_activation_bytes(model, plan)


def step_flops(model: GPTShape, batch: int) -> float:
    """72 B s l h^2 (1 + s / 6h + V / 12 l h): one step's forward and backward FLOPs
    (``md.costmodel.step_flops`` without recomputation)."""
    return costmodel_step_flops(model, batch)


def predict(model: LargeGPT, cluster: Cluster, layout: tuple[int, int, int], batch: int,
            microbatch: int = 1, zero_stage: int = 0) -> dict:
    """Memory per GPU and step time of ``layout`` = (dp, pp, tp) (module docstring)."""
    dp, pp, tp = layout
    if dp * pp * tp != cluster.gpus or batch % (dp * microbatch) or model.layers % pp:
        raise ValueError(f"layout {layout} does not fit {cluster.gpus} GPUs, batch {batch} "
                         f"in micro-batches of {microbatch}, and {model.layers} layers")
    m = batch // (dp * microbatch)
    link = {d: cluster.inter if crosses_nodes(layout, d, cluster.per_node) else cluster.intra
            for d in ("dp", "pp", "tp")}
    state = zero_memory(model.params / (pp * tp), dp, zero_stage)["total"]
    acts = activation_bytes(model, tp, pp, m, microbatch)
    compute = step_flops(model, batch) / (cluster.gpus * cluster.flops)
    act = 2 * microbatch * model.seq * model.hidden  # one activation, fp16
    times = {"compute_s": compute,
             "bubble_s": compute * bubble_overhead(pp, m),
             "tp_s": 4 * model.layers / pp * m * _ring(act, tp, link["tp"]),
             "pp_s": 0.0 if pp == 1 else 2 * m * link["pp"].time(act),
             "dp_s": _ring(2 * model.params / (pp * tp), dp, link["dp"])
             * (1.5 if zero_stage == 3 else 1.0)}
    return {"dp": dp, "pp": pp, "tp": tp, "microbatches": m, "state_bytes": state,
            "activation_bytes": acts, "memory_bytes": state + acts,
            "fits": state + acts <= cluster.memory, **times, "step_s": sum(times.values()),
            "crossing": ",".join(d for d in ("dp", "pp", "tp") if link[d] is cluster.inter)
            or "-"}


def predict_all(model: LargeGPT, cluster: Cluster, batch: int, microbatch: int = 1,
                zero_stage: int = 0) -> list[dict]:
    """``predict`` for every layout of the cluster that the batch and layers divide into."""
    out = []
    for layout in layouts(cluster.gpus):
        dp, pp, _ = layout
        if batch % (dp * microbatch) == 0 and model.layers % pp == 0:
            out.append(predict(model, cluster, layout, batch, microbatch, zero_stage))
    return out


def fastest_fitting(rows: list[dict]) -> dict | None:
    """The quickest predicted layout whose memory fits (None if none does)."""
    fitting = [r for r in rows if r["fits"]]
    return min(fitting, key=lambda r: r["step_s"]) if fitting else None

