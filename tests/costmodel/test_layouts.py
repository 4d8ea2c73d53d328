"""``costmodel.predict_layouts``, the hybrid lesson's sweep: the layouts of N GPUs, which
dimensions cross nodes on a row-major mesh (the PTD-P rule), Korthikanti et al.'s activation
formula, and the parts of each layout's ``predict`` adding up; layouts the model or the batch
do not allow are left out."""

from __future__ import annotations

import pytest

from minidist.costmodel import (
    Cluster,
    GPTShape,
    Plan,
    activation_bytes,
    bubble_fraction,
    fastest_fitting,
    predict_layouts,
    zero_memory,
)
from minidist.costmodel.cluster import crossing_dims
from minidist.costmodel.planner import layouts
from minidist.transports.network import Link

GPT_6B = GPTShape(layers=32, hidden=4096, heads=32, vocab=51200, seq=2048)
TWO_NODES = Cluster(2, 4, Link.nvlink4(), Link.infiniband_ndr(), {"bf16": 400e12}, 80e9)


def test_layouts_are_every_factorisation():
    assert layouts(8) == [(8, 1, 1), (4, 1, 2), (4, 2, 1), (2, 1, 4), (2, 2, 2), (2, 4, 1),
                          (1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1)]
    assert len(layouts(12)) == 18 and all(a * b * c == 12 for a, b, c in layouts(12))


def test_tp_stays_inside_a_node_and_dp_crosses_first():
    """2 nodes of 4: tp groups (adjacent ranks) cross only when tp > 4; dp (the outermost)
    crosses as soon as dp > 1; pp crosses when dp = 1 and pp tp > 4."""
    for dp, pp, tp in layouts(8):
        crossing = crossing_dims((dp, pp, tp), 4)
        assert ("tp" in crossing) == (tp > 4)
        assert ("dp" in crossing) == (dp > 1)
        assert ("pp" in crossing) == (dp == 1 and pp > 1 and pp * tp > 4)


def test_activation_memory_is_korthikantis():
    """No parallelism: s b h (34 + 5 a s / h) bytes per layer (Korthikanti et al. 2022,
    equation 1); 1F1B's first stage keeps pp micro-batches of l / pp layers: the same."""
    s, h, a, layers = 2048, 4096, 32, 32
    per_layer = s * h * (34 + 5 * a * s / h)
    assert activation_bytes(GPT_6B, Plan()) == pytest.approx(per_layer * layers)
    assert activation_bytes(GPT_6B, Plan(pp=4, microbatches=8)) == pytest.approx(
        per_layer * layers)
    assert activation_bytes(GPT_6B, Plan(pp=4, microbatches=2)) == pytest.approx(
        per_layer * layers / 2)


def test_a_sweep_adds_up():
    preds = predict_layouts(GPT_6B, TWO_NODES, 64)
    assert [(p.plan.dp, p.plan.pp, p.plan.tp) for p in preds] == layouts(8)
    r = next(p.row() for p in preds if (p.plan.dp, p.plan.pp, p.plan.tp) == (2, 2, 2))
    assert r["microbatches"] == 32 and r["crossing"] == "dp"
    assert r["state_bytes"] == pytest.approx(zero_memory(GPT_6B.params / 4, 2, 0)["total"])
    # the bubble is (p - 1) / (m + p - 1) of the pipeline's time: compute and the tp and pp
    # traffic of every micro-batch (costmodel/predict.py); parallel/hybrid_costs.py had
    # charged it on the compute alone
    busy = r["compute_s"] + r["tp_s"] + r["pp_s"]
    assert r["bubble_s"] / (busy + r["bubble_s"]) == pytest.approx(bubble_fraction(2, 32))
    parts = ("compute_s", "bubble_s", "tp_s", "pp_s", "dp_s")
    assert r["step_s"] == pytest.approx(sum(r[k] for k in parts))
    rows = [p.row() for p in preds]
    tp8 = next(r for r in rows if r["tp"] == 8)
    tp4 = next(r for r in rows if (r["pp"], r["tp"]) == (2, 4))
    assert tp8["crossing"] == "tp" and tp8["tp_s"] > 10 * tp4["tp_s"]  # IB vs NVLink
    assert not rows[0]["fits"]  # 16 B x 6.7e9 on one GPU: no
    best = fastest_fitting(preds)
    assert best.fits and best.plan.tp <= 4
    assert best.step_s == min(p.step_s for p in preds if p.fits)


def test_what_a_sweep_leaves_out():
    """Layouts whose dp does not divide the batch, whose tp does not divide the heads, and
    ZeRO 2-3 with a pipeline (DeepSpeed's rule, ``Plan``'s) are not predicted."""
    odd = predict_layouts(GPT_6B, TWO_NODES, 63)
    assert [(p.plan.dp, p.plan.pp, p.plan.tp) for p in odd] == [
        layout for layout in layouts(8) if layout[0] == 1]
    three_heads = GPTShape(layers=32, hidden=4092, heads=12, vocab=51200, seq=2048)
    assert all(p.plan.tp in (1, 2, 4) for p in predict_layouts(three_heads, TWO_NODES, 64))
    zero3 = predict_layouts(GPT_6B, TWO_NODES, 64, zero_stage=3)
    assert {p.plan.pp for p in zero3} == {1} and len(zero3) == 4
    assert fastest_fitting([]) is None
