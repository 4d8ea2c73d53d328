"""``parallel.hybrid_costs``: the layouts of N GPUs, which dimensions cross nodes on a
row-major mesh (the PTD-P rule), Korthikanti et al.'s activation formula, and the parts of a
predicted step adding up; bad layouts are refused."""

from __future__ import annotations

import pytest

from minidist.costmodel import bubble_fraction, zero_memory
from minidist.parallel.hybrid_costs import (
    Cluster,
    LargeGPT,
    activation_bytes,
    crosses_nodes,
    fastest_fitting,
    layouts,
    predict,
    predict_all,
)
from minidist.transports.network import Link

GPT_6B = LargeGPT(layers=32, hidden=4096, heads=32, vocab=51200, seq=2048)
TWO_NODES = Cluster(2, 4, Link.nvlink4(), Link.infiniband_ndr(), flops=400e12, memory=80e9)


def test_layouts_are_every_factorisation():
    assert layouts(8) == [(8, 1, 1), (4, 1, 2), (4, 2, 1), (2, 1, 4), (2, 2, 2), (2, 4, 1),
                          (1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1)]
    assert len(layouts(12)) == 18 and all(a * b * c == 12 for a, b, c in layouts(12))


def test_tp_stays_inside_a_node_and_dp_crosses_first():
    """2 nodes of 4: tp groups (adjacent ranks) cross only when tp > 4; dp (the outermost)
    crosses as soon as dp > 1; pp crosses when dp = 1 and pp tp > 4."""
    for dp, pp, tp in layouts(8):
        assert crosses_nodes((dp, pp, tp), "tp", 4) == (tp > 4)
        assert crosses_nodes((dp, pp, tp), "dp", 4) == (dp > 1)
        assert crosses_nodes((dp, pp, tp), "pp", 4) == (dp == 1 and pp > 1 and pp * tp > 4)


def test_activation_memory_is_korthikantis():
    """No parallelism: s b h (34 + 5 a s / h) bytes per layer (Korthikanti et al. 2022,
    equation 1); 1F1B's first stage keeps pp micro-batches of l / pp layers: the same."""
    s, h, a, layers = 2048, 4096, 32, 32
    per_layer = s * h * (34 + 5 * a * s / h)
    assert activation_bytes(GPT_6B, tp=1, pp=1, m=1, microbatch=1) == pytest.approx(
        per_layer * layers)
    assert activation_bytes(GPT_6B, tp=1, pp=4, m=8, microbatch=1) == pytest.approx(
        per_layer * layers)
    assert activation_bytes(GPT_6B, tp=1, pp=4, m=2, microbatch=1) == pytest.approx(
        per_layer * layers / 2)


def test_a_prediction_adds_up():
    r = predict(GPT_6B, TWO_NODES, (2, 2, 2), batch=64)
    assert r["microbatches"] == 32 and r["crossing"] == "dp"
    assert r["state_bytes"] == pytest.approx(zero_memory(GPT_6B.params / 4, 2, 0)["total"])
    assert r["bubble_s"] / (r["compute_s"] + r["bubble_s"]) == pytest.approx(
        bubble_fraction(2, 32))
    parts = ("compute_s", "bubble_s", "tp_s", "pp_s", "dp_s")
    assert r["step_s"] == pytest.approx(sum(r[k] for k in parts))
    rows = predict_all(GPT_6B, TWO_NODES, batch=64)
    tp8 = next(r for r in rows if r["tp"] == 8)
    tp4 = next(r for r in rows if (r["pp"], r["tp"]) == (2, 4))
    assert tp8["crossing"] == "tp" and tp8["tp_s"] > 10 * tp4["tp_s"]  # IB vs NVLink
    assert not rows[0]["fits"]  # 16 B x 6.7e9 on one GPU: no
    best = fastest_fitting(rows)
    assert best["fits"] and best["tp"] <= 4


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match=r"layout \(2, 2, 1\) does not fit 8 GPUs"):
        predict(GPT_6B, TWO_NODES, (2, 2, 1), batch=64)
    with pytest.raises(ValueError, match="batch 63"):
        predict(GPT_6B, TWO_NODES, (2, 2, 2), batch=63)
