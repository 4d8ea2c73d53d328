"""``costmodel.planner``: the search returns only plans that fit, fastest first; for GPT-3
175B on 1024 A100s (batch 1536, as Narayanan et al. SC 2021 section 5.1) it keeps tp inside
a node as Megatron-LM's heuristics say, and we state where the paper's plan ranks."""

from __future__ import annotations

import pytest

from minidist.costmodel import (
    GPT3_175B,
    Cluster,
    Plan,
    best_plan,
    candidate_plans,
    predict,
    rank_of,
    search_plans,
)

A100_1024 = Cluster.dgx_a100(nodes=128)


@pytest.fixture(scope="module")
def ranked():
    return search_plans(GPT3_175B, A100_1024, 1536)


def test_only_fitting_plans_fastest_first(ranked):
    assert len(ranked) > 100 and all(p.fits for p in ranked)
    times = [p.step_s for p in ranked]
    assert times == sorted(times)
    every = list(candidate_plans(GPT3_175B, A100_1024, 1536))
    assert all(p.gpus == 1024 and p.global_batch == 1536 for p in every)
    assert len(every) > len(ranked)  # some do not fit: e.g. dp = 1024, 175B per GPU


def test_gpt3_on_1024_a100s(ranked):
    """Best: dp=16 pp=8 tp=8, m=96, b=1, interleaved v=2, no recomputation, sequence
    parallel, ZeRO-1: 25.4 s per step, 130 TFLOP/s per GPU, 62 GB per GPU. Megatron's
    heuristics: tp = 8 (one node), then the smallest pp that fits (pp = 16 is 0.2% slower:
    less dp traffic, more bubble and pp traffic)."""
    best = ranked[0]
    assert (best.plan.dp, best.plan.pp, best.plan.tp) == (16, 8, 8)
    assert best.plan.recompute == "none" and best.plan.chunks == 2
    assert best.plan.sequence_parallel and best.plan.zero_stage == 1
    assert best.step_s == pytest.approx(25.4, rel=0.01) and best.memory["total"] < 64e9
    pp16 = next(p for p in ranked if (p.plan.dp, p.plan.pp, p.plan.tp) == (8, 16, 8))
    # pp = 16 runs twice the transfers of pp = 8 (m = 192, not 96), each now with the
    # all-gather that follows Megatron's scatter/gather (costmodel/pp.py): +0.16 s of pp and
    # its bubble against -0.22 s of dp. Was < 1.001 (0.05%) when the all-gather was left out.
    assert 1.001 < pp16.step_s / best.step_s < 1.005
    assert best_plan(GPT3_175B, A100_1024, 1536).plan == best.plan
    assert all(p.plan.tp <= 8 for p in ranked[:50])  # tp never leaves a node near the top


def test_where_the_papers_plan_ranks(ranked):
    """The paper's 2021 recipe on this layout (t=8, p=16, d=8, full recomputation,
    interleaved): predicted 34% slower than the best (112th of 924), all of it from
    recomputing the forward (96 vs 72 B s l h^2); with Korthikanti et al.'s selective
    recomputation and sequence parallelism instead it is within 1.1%."""
    paper = Plan(8, 16, 8, 192, recompute="full", chunks=2)  # no ZeRO, no SP in 2021
    i = rank_of(ranked, paper)
    slower = ranked[i].step_s / ranked[0].step_s
    assert ranked[i].plan == paper and 1.30 < slower < 1.38
    selective = Plan(8, 16, 8, 192, zero_stage=1, recompute="selective",
                     sequence_parallel=True, chunks=2)
    # 1.05% (was 0.9%): pp = 16 pays the scatter/gather's all-gather on twice the transfers
    # of the best plan's pp = 8 (see test_gpt3_on_1024_a100s).
    assert ranked[rank_of(ranked, selective)].step_s / ranked[0].step_s < 1.011
    assert 125 < predict(GPT3_175B, A100_1024, paper).tflops_per_gpu < 140  # paper: 140


def test_nothing_fits():
    """GPT-3 on one node: 16 B x 175e9 = 2.8 TB of state over 640 GB."""
    assert search_plans(GPT3_175B, Cluster.dgx_a100(1), 8) == []
    assert best_plan(GPT3_175B, Cluster.dgx_a100(1), 8) is None
    assert rank_of([], Plan()) is None


def test_bad_batch():
    with pytest.raises(ValueError, match="global_batch must be a positive integer, got 0"):
        search_plans(GPT3_175B, A100_1024, 0)
