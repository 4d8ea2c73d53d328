"""A pipeline's costs, as code: its bubble, and the point-to-point traffic between stages.

Bubble (``bubble_fraction``, ``bubble_overhead``): GPipe (Huang et al. 2019), 1F1B
(PipeDream-Flush) and Megatron-LM's interleaved schedule (Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC 2021,
section 2.2): p stages, m micro-batches, v chunks per stage idle (p - 1) / (v m + p - 1) of a
step. The simulator (``parallel/pipeline/simulator.py``) and the measured timelines
(``parallel/pipeline/measure.py``) are checked against it.

Traffic (``pp_time``). Per micro-batch, every stage boundary carries the activation forward
and its gradient back, each the b x s x h hidden states: n = e b s h bytes. A device with v
chunks (interleaved 1F1B) sends v activations and v gradients per micro-batch (the first and
last devices one fewer, but the busy ones set the pace): 2 v m transfers on a step's critical
path. The output of a tensor-parallel block is replicated over its t ranks (after g), so each
tp rank of a stage holds the whole tensor to send, and there are two ways to send it:

* the whole tensor from every tp rank to its peer in the next stage, side by side on their
  own links: alpha + n / B per transfer. This is what ``md.PipelineStage`` under
  ``HybridGPT`` does (``tests/costmodel/test_pp.py`` counts one b s h per rank per boundary
  and micro-batch with ``comm.stats``), and what ``parallel/hybrid_costs.py`` charged
  (2 m (alpha + 2 b s h / B), fp16, no interleaving);
* Megatron-LM's scatter/gather (Narayanan et al., section 4.1; Table 1 ran with it): each tp
  rank sends only its 1/t slice across, and the receiving stage all-gathers the slices over
  its tp link: alpha + n / (t B) + (t - 1) (alpha_tp + n / (t B_tp)) per transfer.

    t_pp = 2 v m (alpha + n / B)                                      (scatter_gather=False)
    t_pp = 2 v m (alpha + n / (t B) + all_gather(n / t, t))           (scatter_gather=True)

``Plan.scatter_gather`` says which (default: Megatron's). The cost model had charged the
scatter without the all-gather that must follow it before the next stage can compute.
"""

from __future__ import annotations

from ..checks import positive_int
from .cluster import PRECISION_BYTES, Cluster
from .collectives import all_gather_time
from .plan import Plan
from .transformer import GPTShape


def _sizes(stages, microbatches, chunks) -> tuple[int, int, int]:
    return (positive_int(stages, "stages", TypeError),
            positive_int(microbatches, "microbatches", TypeError),
            positive_int(chunks, "chunks (model chunks per stage)", TypeError))


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
    p, m, v = _sizes(stages, microbatches, chunks)
    return (p - 1) / (v * m + p - 1)


def bubble_overhead(stages: int, microbatches: int, chunks: int = 1) -> float:
    """The bubble as a fraction of the ideal step time, (p - 1) / (v m): Narayanan et al.
    (SC 2021)'s "bubble time fraction" (GPipe's (p - 1) / m for v = 1). The share of the
    step that is idle is :func:`bubble_fraction`."""
    p, m, v = _sizes(stages, microbatches, chunks)
    return (p - 1) / (v * m)


def pp_time(model: GPTShape, cluster: Cluster, plan: Plan) -> float:
    """Seconds of a step's point-to-point transfers between pipeline stages (module
    docstring); 0 without a pipeline."""
    if plan.pp == 1:
        return 0.0
    n = PRECISION_BYTES[plan.precision] * plan.micro_batch_size * model.seq * model.hidden
    link, t = cluster.link(plan.pp, plan.tp), plan.tp
    if plan.scatter_gather and t > 1:
        tp_link = cluster.link(t, 1)
        one = link.time(n / t) + all_gather_time(n / t, t, tp_link.alpha, tp_link.bandwidth)
    else:
        one = link.time(n)
    return 2 * plan.chunks * plan.microbatches * one
