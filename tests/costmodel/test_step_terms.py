"""The tp and pp terms of ``costmodel.predict``, counted on the code: one step of
``HybridGPT`` (pp = 1 and 2, tp = 2, ring all-reduces) makes, per micro-batch and stage,
the all-reduces ``costmodel.tp.all_reduces`` lists (4 per block, the embedding's on the first
stage, the head's and the loss's 3 of b s on the last) and sends one whole b s h tensor per
stage boundary from every tp rank (no scatter/gather), as ``comm.stats`` counts them; and
``tp_time`` / ``pp_time`` are those counts priced by the ring and the link."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.costmodel import Cluster, GPTShape, Plan
from minidist.costmodel.collectives import all_gather_time, ring_time
from minidist.costmodel.pp import pp_time
from minidist.costmodel.tp import all_reduces, tp_time
from minidist.models import GPTConfig, synthetic_tokens
from minidist.parallel.hybrid import HybridGPT

L, B, S, H, M = 4, 8, 16, 32, 4  # 4 micro-batches of 2 sequences
CFG = GPTConfig(vocab_size=64, block_size=S, n_layer=L, n_head=4, n_embd=H, tie_weights=False)
BSH, BS = (B // M) * S * H, (B // M) * S  # elements of one micro-batch's activation, loss


def _counted_step(comm, pp: int) -> dict:
    """This rank's traffic in one step after a warm-up: on tp, the all-reduces of b s h and
    of b s per micro-batch (with tp = 2 a ring all-reduce of n elements sends 2 messages and
    n elements, so calls and elements give the two counts); on pp, elements and messages."""
    model = HybridGPT(CFG, md.DeviceMesh(comm, {"pp": pp, "tp": 2}), microbatches=M,
                      algorithm="ring")
    x, y = synthetic_tokens(1, B, S, CFG.vocab_size, seed=1)[0]
    model.step(x, y)
    tp, pipe = model.mesh["tp"], model.mesh["pp"]
    tp.stats.reset()
    pipe.stats.reset()
    model.step(x, y)
    calls, elements = tp.stats.messages_sent / 2, tp.stats.bytes_sent / 4  # float32
    small = (calls * BSH - elements) / (BSH - BS)
    return {"stage": model.mesh.coords["pp"], "bsh": (calls - small) / M, "bs": small / M,
            "pp_elements": pipe.stats.bytes_sent / 4, "pp_messages": pipe.stats.messages_sent}


@pytest.mark.parametrize("pp", [1, 2])
def test_tensor_parallel_all_reduces_per_microbatch_and_stage(pp):
    """4 per block of the stage's L / pp, +1 (embedding, forward) on the first stage, +1
    (head, backward) and 3 of b s (cross-entropy) on the last: 4 L + 2 and 3 without a
    pipeline. The cost model's old term, (4 l/pp + 2) m, charged the embedding and the head
    to every stage; parallel/hybrid_costs.py's 4 (l/pp) m, neither."""
    for got in md.launch(_counted_step, 2 * pp, args=(pp,), timeout=120):
        first, last = got["stage"] == 0, got["stage"] == pp - 1
        want = all_reduces(L // pp, embedding=first, head=last)
        assert (got["bsh"], got["bs"]) == (want["bsh"], want["bs"]), got
    assert all_reduces(L) == {"bsh": 4 * L + 2, "bs": 3}
    assert all_reduces(L, recompute="full") == {"bsh": 6 * L + 2, "bs": 3}


def test_pipeline_sends_one_whole_activation_per_boundary_and_microbatch():
    """pp = 2, tp = 2: each rank of the first stage sends M activations of b s h, each of the
    last M gradients (besides a few bytes a step: the loss's broadcast, the stage's shape
    flag): every tp rank the whole tensor, not 1/tp of it, which is
    ``Plan(scatter_gather=False)``."""
    for got in md.launch(_counted_step, 4, args=(2,), timeout=120):
        assert M * BSH <= got["pp_elements"] <= M * BSH + 4, got  # + at most 16 bytes
        assert M <= got["pp_messages"] <= M + 2, got


LINK = md.Link(alpha=20e-6, bandwidth=2e9)
HERE = Cluster(1, 4, LINK, LINK, {"fp32": 1e10}, 16e9)
SHAPE = GPTShape.from_config(CFG)


def test_tp_time_prices_the_last_stages_count():
    ring = ring_time(4 * BSH, 2, LINK.alpha, LINK.bandwidth)
    loss = ring_time(4 * BS, 2, LINK.alpha, LINK.bandwidth)
    for pp in (1, 2):
        plan = Plan(dp=2 // pp, pp=pp, tp=2, microbatches=M, micro_batch_size=B // M,
                    precision="fp32")
        n = all_reduces(L // pp, embedding=pp == 1)
        assert tp_time(SHAPE, HERE, plan) == pytest.approx(M * (n["bsh"] * ring + 3 * loss))
    assert n == {"bsh": 4 * L // 2 + 1, "bs": 3}  # pp = 2: the last stage, not 4 l/pp + 2


def test_pp_time_with_and_without_scatter_gather():
    whole = Plan(pp=2, tp=2, microbatches=M, micro_batch_size=B // M, precision="fp32",
                 scatter_gather=False)
    assert pp_time(SHAPE, HERE, whole) == pytest.approx(2 * M * LINK.time(4 * BSH))
    sliced = Plan(pp=2, tp=2, microbatches=M, micro_batch_size=B // M, precision="fp32")
    gather = all_gather_time(4 * BSH / 2, 2, LINK.alpha, LINK.bandwidth)
    assert pp_time(SHAPE, HERE, sliced) == pytest.approx(
        2 * M * (LINK.time(4 * BSH / 2) + gather))
    assert pp_time(SHAPE, HERE, Plan(tp=2, microbatches=M)) == 0.0
