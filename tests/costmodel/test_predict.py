"""``costmodel.predict``: each part of a predicted step and of the memory per GPU is the
formula its docstring cites (Korthikanti et al. 2022 for activations, ZeRO for model state,
the ring all-reduce for tp and dp, the all-gather of Megatron's scatter/gather for pp, the
bubble), and the parts add up. ``test_step_terms.py`` counts the tp and pp terms on the
code."""

from __future__ import annotations

import pytest

from minidist.costmodel import (
    GPT3_175B,
    Cluster,
    GPTShape,
    Plan,
    activation_bytes,
    bubble_overhead,
    predict,
    step_flops,
    training_days,
    zero_memory,
)
from minidist.costmodel.collectives import all_gather_time, ring_time

A100_1024 = Cluster.dgx_a100(nodes=128)
GPT_6B = GPTShape(layers=32, hidden=4096, heads=32, vocab=51200, seq=2048)
ONE_NODE = Cluster.dgx_a100(nodes=1)


def _one(plan: Plan) -> float:
    """Bytes per layer per micro-batch: the activation of a 1-stage, 1-micro-batch plan."""
    return activation_bytes(GPT_6B, plan) / GPT_6B.layers


@pytest.mark.parametrize("tp, sp, recompute, per_sbh", [
    (1, False, "none", lambda a, s, h, t: 34 + 5 * a * s / h),
    (8, False, "none", lambda a, s, h, t: 10 + 24 / t + 5 * a * s / (h * t)),
    (8, True, "none", lambda a, s, h, t: 34 / t + 5 * a * s / (h * t)),
    (8, False, "selective", lambda a, s, h, t: 10 + 24 / t),
    (8, True, "selective", lambda a, s, h, t: 34 / t),
    (8, False, "full", lambda a, s, h, t: 2),
    (8, True, "full", lambda a, s, h, t: 2 / t),
])
def test_activations_are_korthikantis_table_2(tp, sp, recompute, per_sbh):
    s, h, a, b = GPT_6B.seq, GPT_6B.hidden, GPT_6B.heads, 2
    plan = Plan(tp=tp, micro_batch_size=b, recompute=recompute, sequence_parallel=sp)
    assert _one(plan) == pytest.approx(s * b * h * per_sbh(a, s, h, tp), rel=1e-12)
    assert _one(Plan(tp=tp, micro_batch_size=b, recompute=recompute, sequence_parallel=sp,
                     precision="fp32")) == pytest.approx(2 * _one(plan))


def test_1f1b_first_stage_holds_pp_microbatches():
    one = activation_bytes(GPT_6B, Plan())
    assert activation_bytes(GPT_6B, Plan(pp=4, microbatches=8)) == pytest.approx(one)
    assert activation_bytes(GPT_6B, Plan(pp=4, microbatches=2)) == pytest.approx(one / 2)
    # interleaved: L (1 + (p - 1) / (p v)) layers (Korthikanti et al., section 4.2.3)
    assert activation_bytes(GPT_6B, Plan(pp=4, microbatches=8, chunks=2)) == pytest.approx(
        one * (1 + 3 / 8))


def test_model_state_is_zero_memory_of_the_local_shard():
    p = predict(GPT3_175B, A100_1024, Plan(8, 16, 8, 192, zero_stage=1))
    want = zero_memory(GPT3_175B.params / 128, 8, 1)
    assert {k: p.memory[k] for k in ("params", "grads", "optimizer")} == pytest.approx(
        {k: want[k] for k in ("params", "grads", "optimizer")})
    assert p.memory["total"] == pytest.approx(sum(v for k, v in p.memory.items()
                                                  if k != "total"))
    fp32 = predict(GPT3_175B, A100_1024, Plan(8, 16, 8, 192, precision="fp32"))
    assert fp32.memory["params"] == 2 * p.memory["params"]  # 4 bytes, K = 8 (Adam m, v)
    assert fp32.memory["optimizer"] == pytest.approx(8 * GPT3_175B.params / 128)


def test_one_gpu_is_all_compute():
    p = predict(GPT_6B, ONE_NODE, Plan(dp=8, microbatches=1))
    assert p.times["tp_s"] == p.times["pp_s"] == p.times["bubble_s"] == 0.0
    alone = Cluster(1, 1, ONE_NODE.intra, ONE_NODE.inter, {"bf16": 312e12}, 80e9, 0.5)
    q = predict(GPT_6B, alone, Plan(microbatches=4))
    assert q.step_s == q.times["compute_s"] == pytest.approx(
        step_flops(GPT_6B, 4) / 156e12)
    assert q.tflops_per_gpu == pytest.approx(156) and q.mfu == pytest.approx(0.5)


def test_the_parts_of_a_step():
    plan = Plan(dp=8, pp=16, tp=8, microbatches=192, recompute="full")
    p = predict(GPT3_175B, A100_1024, plan)
    act = 2 * 2048 * 12288  # one micro-batch's hidden states, bf16
    intra, inter = A100_1024.intra, A100_1024.inter
    assert p.times["compute_s"] == pytest.approx(
        step_flops(GPT3_175B, 1536, "full") / (1024 * 312e12 * 0.4735))
    # tp: the last stage's all-reduces per micro-batch: 6 per layer of its 96/16 (2 forward,
    # 2 backward, 2 in the recomputed forward), 1 for the head (backward; the embedding's is on
    # the first stage), 3 of b s for the cross-entropy (costmodel/tp.py). Was (6 l/pp + 2) m
    # ring(b s h): the embedding's and the head's on every stage, the loss's left out.
    ring = ring_time(act, 8, intra.alpha, intra.bandwidth)
    loss = ring_time(act / 12288, 8, intra.alpha, intra.bandwidth)
    assert p.times["tp_s"] == pytest.approx((6 * 96 / 16 + 1) * 192 * ring + 3 * 192 * loss)
    # pp: scatter/gather sends 1/tp of the activation across, then all-gathers it over the tp
    # link before the next stage can compute (Narayanan et al. 2021, section 4.1;
    # costmodel/pp.py). Was 2 m inter(b s h / tp): the all-gather left out.
    gather = all_gather_time(act / 8, 8, intra.alpha, intra.bandwidth)
    assert p.times["pp_s"] == pytest.approx(2 * 192 * (inter.time(act / 8) + gather))
    whole = predict(GPT3_175B, A100_1024, Plan(dp=8, pp=16, tp=8, microbatches=192,
                                               recompute="full", scatter_gather=False))
    assert whole.times["pp_s"] == pytest.approx(2 * 192 * inter.time(act))
    assert p.times["dp_s"] == pytest.approx(
        ring_time(2 * GPT3_175B.params / 128, 8, inter.alpha, inter.bandwidth))
    ideal = p.times["compute_s"] + p.times["tp_s"] + p.times["pp_s"]
    assert p.times["bubble_s"] == pytest.approx(bubble_overhead(16, 192) * ideal)
    assert p.step_s == pytest.approx(sum(p.times.values()))
    assert p.fits and p.tokens_per_s == pytest.approx(1536 * 2048 / p.step_s)
    zero3 = predict(GPT_6B, ONE_NODE, Plan(dp=8, microbatches=1, zero_stage=3))
    plain = predict(GPT_6B, ONE_NODE, Plan(dp=8, microbatches=1))
    assert zero3.times["dp_s"] == pytest.approx(1.5 * plain.times["dp_s"])


def test_days_to_train_gpt3():
    """Prediction.days counts the exact FLOPs; Megatron's 8 T P / (n X) drops the s/6h and
    V/16lh terms, so at the predicted X the two agree within 6%."""
    p = predict(GPT3_175B, A100_1024, Plan(8, 16, 8, 192, recompute="full"))
    approx = training_days(GPT3_175B.params, 300e9, 1024, p.tflops_per_gpu * 1e12)
    assert p.days(300e9) == pytest.approx(approx, rel=0.06) and p.days(300e9) > approx
