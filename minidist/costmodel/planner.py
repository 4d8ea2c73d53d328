"""Search the plans for a model on a cluster: every layout and setting, predicted, ranked.

``search_plans(model, cluster, global_batch)`` enumerates every dp x pp x tp = N layout
that the model allows (tp dividing the heads, pp the layers, dp the batch), every
micro-batch size, ZeRO stage, recomputation, sequence parallelism and chunk count it is
given, predicts each (``predict``), drops those that do not fit in a GPU's memory and
returns the rest fastest first. Megatron-LM's own heuristics (Narayanan et al., SC 2021,
section 3) say what it should find: tp up to the GPUs of one node, then pp to fit the
model, then dp for the rest; the test for GPT-3 on 1024 A100s checks where the paper's
choice ranks.

``predict_layouts(model, cluster, global_batch)`` is the narrower sweep of the hybrid lesson
and ``minidist bench hybrid``: one plan per dp x pp x tp layout, everything else fixed, in
``layouts`` order, fitting or not; ``fastest_fitting`` picks from it.

A brute-force search is enough here (thousands of plans, a fraction of a second); the
simulators that plan real jobs (Calculon, ASTRA-sim, Alpa's ILP) search larger spaces
with finer models.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from ..checks import positive_int
from .cluster import Cluster
from .plan import Plan
from .predict import Prediction, predict
from .transformer import RECOMPUTE, GPTShape


def layouts(world: int) -> list[tuple[int, int, int]]:
    """Every (dp, pp, tp) with dp pp tp = world, dp largest first."""
    return [(dp, pp, world // (dp * pp)) for dp in range(world, 0, -1) if world % dp == 0
            for pp in range(1, world // dp + 1) if (world // dp) % pp == 0]


def _allowed(model: GPTShape, pp: int, tp: int) -> bool:
    return model.heads % tp == 0 and model.layers % pp == 0


def candidate_plans(model: GPTShape, cluster: Cluster, global_batch: int, *,
                    precision: str = "bf16", micro_batch_sizes=(1, 2, 4, 8),
                    zero_stages=(0, 1), recomputes=RECOMPUTE, sequence_parallel=(False, True),
                    chunks=(1, 2)) -> Iterator[Plan]:
    """Every valid plan of ``global_batch`` sequences per step on ``cluster.gpus`` GPUs."""
    positive_int(global_batch, "global_batch")
    for dp, pp, tp in layouts(cluster.gpus):
        if not _allowed(model, pp, tp):
            continue
        for b in micro_batch_sizes:
            if global_batch % (dp * b):
                continue
            m = global_batch // (dp * b)
            for z, r, sp, v in itertools.product(zero_stages, recomputes, sequence_parallel,
                                                 chunks):
                if (sp and (tp == 1 or model.seq % tp)) or (z >= 2 and pp > 1) or \
                        (v > 1 and (pp == 1 or m % pp or model.layers % (pp * v))):
                    continue
                yield Plan(dp, pp, tp, m, b, z, precision, r, sp, v)


def search_plans(model: GPTShape, cluster: Cluster, global_batch: int,
                 **space) -> list[Prediction]:
    """The predictions of every candidate plan that fits in memory, fastest first (equal
    times: least memory first). ``space`` narrows or widens the search
    (``candidate_plans``' keyword arguments)."""
    preds = (predict(model, cluster, plan)
             for plan in candidate_plans(model, cluster, global_batch, **space))
    return _fastest_first(preds)


def _fastest_first(preds) -> list[Prediction]:
    """Those that fit, fastest first (equal times: least memory first)."""
    return sorted((p for p in preds if p.fits), key=lambda p: (p.step_s, p.memory["total"]))


def best_plan(model: GPTShape, cluster: Cluster, global_batch: int,
              **space) -> Prediction | None:
    """The fastest plan that fits, or None when none does."""
    ranked = search_plans(model, cluster, global_batch, **space)
    return ranked[0] if ranked else None


def rank_of(ranked: list[Prediction], plan: Plan) -> int | None:
    """Where ``plan`` sits in ``search_plans``' list (0: the best), None if absent."""
    return next((i for i, p in enumerate(ranked) if p.plan == plan), None)


def predict_layouts(model: GPTShape, cluster: Cluster, global_batch: int,
                    micro_batch_size: int = 1, zero_stage: int = 0,
                    precision: str = "bf16") -> list[Prediction]:
    """``predict`` for one plan per layout of the cluster that the model and the batch
    allow (``candidate_plans`` with only the layout free: 1F1B, no recomputation, no
    sequence parallelism), in ``layouts`` order, whether it fits or not."""
    plans = candidate_plans(model, cluster, global_batch, precision=precision,
                            micro_batch_sizes=(micro_batch_size,), zero_stages=(zero_stage,),
                            recomputes=("none",), sequence_parallel=(False,), chunks=(1,))
    return [predict(model, cluster, plan) for plan in plans]


def fastest_fitting(preds: list[Prediction]) -> Prediction | None:
    """The quickest of ``preds`` whose memory fits (None if none does)."""
    ranked = _fastest_first(preds)
    return ranked[0] if ranked else None
