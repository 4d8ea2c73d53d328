"""The cost model: time, bytes and memory of collectives, strategies and whole training
plans, as formulas in code, for clusters far larger than this machine. ``auto``, the
strategies, the lessons, the grader, the benches and the tests use these same functions:
each closed form has one home here.

* ``collectives.py``: bytes per rank (exact, as ``comm.stats`` counts them) and alpha-beta
  time of every collective and all_reduce path (Thakur, Rabenseifner and Gropp 2005);
* ``cluster.py``: a cluster of nodes (``Cluster``, DGX A100 / H100 presets), which mesh
  groups cross nodes, and every all_reduce path's time when each hop pays its own link;
* ``transformer.py``: a GPT's shape, parameters (``transformer_params``, Megatron-LM), FLOPs
  per step, days of training;
* ``dp.py``, ``zero.py``, ``tp.py``, ``pp.py``, ``ps.py``, ``elastic.py``: each strategy's
  bytes and time (ZeRO's memory, ``zero_memory``; a pipeline's bubble, ``bubble_fraction``;
  Young's commit interval), and the tp, pp and dp terms of a plan's step, derived by
  counting what the code sends;
* ``plan.py``, ``predict.py``, ``planner.py``: a plan (dp·pp·tp, ZeRO, micro-batches,
  precision, recomputation, sequence parallelism, interleaving, scatter/gather), its step
  time by part and memory by part (``predict``), and the search over plans;
* ``validation.py``: the published figures the tests compare with (Megatron-LM Table 1,
  ZeRO Figure 1, Megatron-LM's training-time estimates).

    model = md.costmodel.GPT3_175B                    # a GPTShape: layers, hidden, heads, ...
    cluster = md.costmodel.Cluster.dgx_a100(nodes=128)
    plan = md.costmodel.Plan(dp=8, pp=16, tp=8, microbatches=192, recompute="full")
    md.costmodel.predict(model, cluster, plan)        # step time by part, memory by part, MFU
    md.costmodel.search_plans(model, cluster, global_batch=1536)[0]   # the fastest that fits

Nothing overlaps in this model and each kernel runs at one efficiency; the simulators that
plan real jobs model more: Calculon (Isaev et al., SC 2023), ASTRA-sim (Rashidi et al.
2020), and the scaling-book's rooflines (Austin et al., "How to Scale Your Model", jax-ml).
"""

# First: it imports minidist.collectives' leaves, whose package imports cluster_table from
# .cluster, so either package can be imported first.
from . import collectives  # noqa: F401
from .cluster import PRECISION_BYTES, Cluster
from .plan import Plan
from .planner import (
    best_plan,
    candidate_plans,
    fastest_fitting,
    predict_layouts,
    rank_of,
    search_plans,
)
from .pp import bubble_fraction, bubble_overhead
from .predict import Prediction, activation_bytes, memory_bytes, predict, step_times
from .transformer import (
    GPT3_175B,
    RECOMPUTE,
    GPTShape,
    model_flops,
    step_flops,
    training_days,
    transformer_params,
)
from .zero import ZERO_STAGES, zero_memory

__all__ = ["GPT3_175B", "PRECISION_BYTES", "RECOMPUTE", "ZERO_STAGES", "Cluster", "GPTShape",
           "Plan", "Prediction", "activation_bytes", "best_plan", "bubble_fraction",
           "bubble_overhead", "candidate_plans", "fastest_fitting", "memory_bytes",
           "model_flops", "predict", "predict_layouts", "rank_of", "search_plans",
           "step_flops", "step_times", "training_days", "transformer_params", "zero_memory"]
