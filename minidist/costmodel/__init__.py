"""The cost model: time and memory of a training plan, as formulas in code, for clusters far
larger than this machine. The lessons, ``auto`` and the tests use these same functions.

* ``transformer_params``: Megatron-LM's parameter count (Narayanan et al., SC 2021).
* ``zero_memory``: model-state bytes per rank under ZeRO stages 0-3 (Rajbhandari et al.,
  SC 2020).
* ``bubble_fraction``, ``bubble_overhead``: a pipeline's bubble (GPipe, Huang et al. 2019;
  interleaved 1F1B, Narayanan et al. SC 2021).
* ``training_days``: Megatron-LM's 8 T P / (n X) estimate of a training run.

At cluster scale (``model.py``, ``cluster.py``, ``plan.py``, ``predict.py``, ``planner.py``):

    model = md.costmodel.GPT3_175B                    # a GPTShape: layers, hidden, heads, ...
    cluster = md.costmodel.Cluster.dgx_a100(nodes=128)
    plan = md.costmodel.Plan(dp=8, pp=16, tp=8, microbatches=192, recompute="full")
    md.costmodel.predict(model, cluster, plan)        # step time by part, memory by part, MFU
    md.costmodel.search_plans(model, cluster, global_batch=1536)[0]   # the fastest that fits

``validation.py`` holds the published figures the tests compare with (Megatron-LM Table 1,
ZeRO Figure 1, Megatron-LM's training-time estimates). Nothing overlaps in this model and
each kernel runs at one efficiency; the simulators that plan real jobs model more:
Calculon (Isaev et al., SC 2023), ASTRA-sim (Rashidi et al. 2020), and the scaling-book's
rooflines (Austin et al., "How to Scale Your Model", jax-ml). The collectives' own costs (bytes
per rank, alpha-beta time) are in ``minidist.collectives.costs``.
"""

from .cluster import PRECISION_BYTES, Cluster
from .formulas import (
    ZERO_STAGES,
    bubble_fraction,
    bubble_overhead,
    training_days,
    transformer_params,
    zero_memory,
)
from .model import GPT3_175B, RECOMPUTE, GPTShape, model_flops, step_flops
from .plan import Plan
from .planner import best_plan, candidate_plans, rank_of, search_plans
from .predict import Prediction, activation_bytes, memory_bytes, predict, step_times

__all__ = ["GPT3_175B", "PRECISION_BYTES", "RECOMPUTE", "ZERO_STAGES", "Cluster", "GPTShape",
           "Plan", "Prediction", "activation_bytes", "best_plan", "bubble_fraction",
           "bubble_overhead", "candidate_plans", "memory_bytes", "model_flops", "predict",
           "rank_of", "search_plans", "step_flops", "step_times", "training_days",
           "transformer_params", "zero_memory"]
