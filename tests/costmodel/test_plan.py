"""``costmodel.plan`` and ``costmodel.cluster``: a plan that cannot run is refused with an
error naming the mistake; the cluster presets hold their datasheet figures; which groups of
the row-major mesh cross nodes."""

from __future__ import annotations

import pytest

from minidist.costmodel import GPT3_175B, Cluster, Plan, predict
from minidist.costmodel.cluster import A100_EFFICIENCY, spans_nodes

A100_1024 = Cluster.dgx_a100(nodes=128)


def test_a_plan_adds_up():
    plan = Plan(dp=8, pp=16, tp=8, microbatches=192, micro_batch_size=1)
    assert plan.gpus == 1024 and plan.global_batch == 1536
    assert plan.check(GPT3_175B, A100_1024) is plan
    assert str(plan) == "dp=8 pp=16 tp=8 m=192 b=1 bf16"
    assert str(Plan(2, 2, 2, 4, zero_stage=1, recompute="full", sequence_parallel=True,
                    chunks=2)) == "dp=2 pp=2 tp=2 m=4 b=1 bf16 ZeRO-1 recompute=full SP v=2"
    assert str(Plan(pp=2, tp=2, scatter_gather=False)) == \
        "dp=1 pp=2 tp=2 m=1 b=1 bf16 no scatter/gather"


@pytest.mark.parametrize("plan, message", [
    (Plan(dp=8, pp=16, tp=4, microbatches=8),
     r"plan dp\*pp\*tp = 8\*16\*4 = 512 GPUs, but the cluster has 1024"),
    (Plan(dp=8, pp=1, tp=128, microbatches=8), "tp=128 must divide heads=96"),
    (Plan(dp=1, pp=1, tp=1024, microbatches=8), "tp=1024 must divide heads=96"),
    (Plan(dp=16, pp=1, tp=64, microbatches=8), "tp=64 must divide heads=96"),
    (Plan(dp=1, pp=128, tp=8, microbatches=8), "pp=128 > layers=96"),
    (Plan(dp=4, pp=32, tp=8, microbatches=32, chunks=2), r"pp\*chunks = 32\*2 must divide "
                                                         "layers=96"),
    (Plan(dp=16, pp=64, tp=1, microbatches=8), r"pp\*chunks = 64\*1 must divide layers=96"),
])
def test_plans_that_do_not_fit_the_model_or_cluster(plan, message):
    with pytest.raises(ValueError, match=message):
        predict(GPT3_175B, A100_1024, plan)


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp8"}, "unknown precision 'fp8'; known: fp32, bf16, fp16"),
    ({"recompute": "some"}, "Plan recompute must be one of"),
    ({"zero_stage": 4}, "Plan zero_stage must be one of 0, 1, 2, 3, got 4"),
    ({"dp": 0}, "Plan dp must be a positive integer, got 0"),
    ({"microbatches": 1.5}, "Plan microbatches must be a positive integer, got 1.5"),
    ({"pp": 2, "zero_stage": 2}, "zero_stage=2 with pp=2"),
    ({"pp": 4, "microbatches": 6, "chunks": 2}, "microbatches divisible by pp"),
    ({"chunks": 2}, "needs pp > 1"),
])
def test_bad_plans_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Plan(**kwargs)


def test_flags_must_be_bools():
    with pytest.raises(TypeError, match="sequence_parallel must be a bool"):
        Plan(tp=2, sequence_parallel="yes")
    with pytest.raises(TypeError, match="Plan scatter_gather must be a bool, got 1"):
        Plan(pp=2, scatter_gather=1)


def test_cluster_presets_and_errors():
    assert A100_1024.gpus == 1024 and A100_1024.memory == 80e9
    assert A100_1024.flops("bf16") == pytest.approx(312e12 * A100_EFFICIENCY)
    assert A100_1024.intra.bandwidth == 300e9 and A100_1024.inter.bandwidth == 25e9
    h100 = Cluster.dgx_h100(nodes=2)
    assert h100.peak_flops["bf16"] == 989e12 and h100.inter.bandwidth == 50e9
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        A100_1024.flops("int8")
    with pytest.raises(ValueError, match="Cluster nodes must be a positive integer, got 0"):
        A100_1024.with_nodes(0)
    with pytest.raises(TypeError, match="Cluster inter must be an md.Link"):
        Cluster(1, 8, A100_1024.intra, "IB", {"bf16": 1e12}, 80e9)
    with pytest.raises(ValueError, match=r"peak_flops\['bf16'\] must be > 0, got 0"):
        Cluster(1, 8, A100_1024.intra, A100_1024.inter, {"bf16": 0}, 80e9)
    with pytest.raises(ValueError, match="unknown precision 'tf32'"):
        Cluster(1, 8, A100_1024.intra, A100_1024.inter, {"tf32": 1e12}, 80e9)
    with pytest.raises(ValueError, match="efficiency"):
        Cluster(1, 8, A100_1024.intra, A100_1024.inter, {"bf16": 1e12}, 80e9, efficiency=2)


def test_which_groups_cross_nodes():
    """8 GPUs per node, dp x pp x tp row-major: tp = 8 stays inside a node, pp crosses as
    soon as tp x pp > 8, dp whenever dp > 1 and pp tp >= 8 (the PTD-P placement)."""
    w = 1024
    assert not spans_nodes(8, 1, 8, w) and spans_nodes(16, 1, 8, w)   # tp
    assert spans_nodes(16, 8, 8, w) and not spans_nodes(2, 4, 8, w)   # pp after tp
    assert spans_nodes(8, 128, 8, w) and not spans_nodes(1, 128, 8, w)
    assert A100_1024.link(8, 1) is A100_1024.intra
    assert A100_1024.link(16, 8) is A100_1024.inter
    # 2520 GPUs, tp = 8, pp = 35 (Megatron's 529.6B row): every pp group crosses
    assert spans_nodes(35, 8, 8, 2520)
