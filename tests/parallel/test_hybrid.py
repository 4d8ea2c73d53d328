"""``HybridGPT``: the small GPT over a dp x pp x tp mesh trains like one process on the full
batch (float64: every step's loss and, after the steps, every parameter of the full model
gathered back) for DP x TP, DP x PP, PP x TP, DP x PP x TP and ZeRO as the data-parallel
dimension, on up to 8 ranks; synchronises gradients over dp once per step whatever the
number of micro-batches; holds only its own stage's state; refuses what it cannot train."""

from __future__ import annotations

import math

import pytest
import torch

import minidist as md
from minidist.costmodel import collectives as collective_costs
from minidist.models import GPT, GPTConfig, synthetic_tokens
from minidist.parallel.hybrid import HybridGPT

# n_head and vocab divisible by tp <= 4; 4 layers (embedding, 2 blocks, head) for pp <= 4
CFG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, tie_weights=False)
DATA = synthetic_tokens(2, 12, 8, CFG.vocab_size, seed=1)  # 2 steps, 12 sequences of 8
SGD = {"optimizer_class": torch.optim.SGD, "lr": 0.2, "momentum": 0.9}
ADAMW = {"optimizer_class": torch.optim.AdamW, "lr": 1e-2}
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def _single(cfg: GPTConfig, opt: dict) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The oracle: one process, the full batch, the same optimizer."""
    model = GPT(cfg).double()
    kwargs = {k: v for k, v in opt.items() if k != "optimizer_class"}
    optimizer = opt["optimizer_class"](model.parameters(), **kwargs)
    losses = []
    for x, y in DATA:
        optimizer.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_rank(comm, cfg: GPTConfig, shape: dict, options: dict):
    mesh = md.DeviceMesh(comm, shape)
    model = HybridGPT(cfg, mesh, dtype=torch.float64, **options)
    for name in shape:  # the mesh completed with size-1 dimensions keeps the groups
        assert model.mesh.ranks(name) == mesh.ranks(name)
    losses = [model.step(x, y) for x, y in DATA]
    return losses, model.full_parameters()


# (mesh, options): every combination; uneven micro-batches (a dp slice of 6 in 4); every
# schedule; ZeRO 0-3 as the dp dimension
CASES = {
    "dp2 x tp2": ({"dp": 2, "tp": 2}, {"microbatches": 1}),
    "tp2 x dp2, tp outermost": ({"tp": 2, "dp": 2}, {"microbatches": 2}),
    "dp2 x pp2, uneven": ({"dp": 2, "pp": 2}, {"microbatches": 4, "schedule": "gpipe"}),
    "pp2 x tp2": ({"pp": 2, "tp": 2}, {"microbatches": 3}),
    "pp4 x tp2": ({"pp": 4, "tp": 2}, {"microbatches": 2}),
    "dp2 x pp2 x tp2": ({"dp": 2, "pp": 2, "tp": 2}, {"microbatches": 2}),
    "dp3 x pp2, naive": ({"dp": 3, "pp": 2}, {"microbatches": 2, "schedule": "naive"}),
    "zero1 dp2 x pp2 x tp2": ({"dp": 2, "pp": 2, "tp": 2}, {"microbatches": 2, "zero_stage": 1}),
    "zero2 dp2 x tp2": ({"dp": 2, "tp": 2}, {"microbatches": 2, "zero_stage": 2}),
    "zero3 dp4": ({"dp": 4}, {"zero_stage": 3}),
    "zero0 dp2 x pp2": ({"dp": 2, "pp": 2}, {"microbatches": 2, "zero_stage": 0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_one_process(case):
    """Every rank returns the reference's losses, and the full model it gathers back
    (tp gathered, pp summed) equals the reference's parameters; AdamW where ZeRO shards
    its two moments, SGD with momentum elsewhere."""
    shape, options = CASES[case]
    opt = ADAMW if options.get("zero_stage") in (1, 3) else SGD
    want_losses, want = _single(CFG, opt)
    world = math.prod(shape.values())
    results = md.launch(_train_rank, world, args=(CFG, shape, {**options, **opt}), timeout=60)
    for rank, (losses, params) in enumerate(results):
        torch.testing.assert_close(losses, want_losses, **TIGHT, msg=f"rank {rank}")
        assert list(params) == list(want)
        for name, p in params.items():
            torch.testing.assert_close(p, want[name], **TIGHT, msg=f"{name} on rank {rank}")


def test_tied_head_without_a_pipeline():
    """GPT's default head tied to the embedding is fine when no pipeline cuts them apart."""
    tied = GPTConfig(**{**CFG.__dict__, "tie_weights": True})
    want_losses, want = _single(tied, SGD)
    results = md.launch(_train_rank, 4, args=(tied, {"dp": 2, "tp": 2}, SGD), timeout=60)
    for losses, params in results:
        torch.testing.assert_close(losses, want_losses, **TIGHT)
        assert list(params) == list(want)  # the tied weight once, as GPT lists it
        for name, p in params.items():
            torch.testing.assert_close(p, want[name], **TIGHT, msg=name)


def _dp_traffic_rank(comm, microbatches: int):
    """Bytes this rank sends over dp in one step, with ring all-reduces (counted in stats)."""
    mesh = md.DeviceMesh(comm, {"dp": 2, "pp": 2})
    model = HybridGPT(CFG, mesh, microbatches, dtype=torch.float64, algorithm="ring", lr=0.1)
    dp = model.mesh["dp"]  # the mesh completed with tp of size 1
    dp.stats.reset()
    model.step(*DATA[0])
    numel = sum(p.numel() for p in model.params)
    return dp.stats.bytes_sent, collective_costs.ring_bytes(numel, 8, 2, dp.rank)


def test_gradients_synchronised_once_per_step():
    """With 1 or 6 micro-batches each rank sends the bytes of ONE ring all-reduce of its
    stage's gradients over dp (plus the step's 8-byte loss): the sync waits for the last
    micro-batch instead of running after each."""
    one, six = (md.launch(_dp_traffic_rank, 4, args=(m,), timeout=60) for m in (1, 6))
    assert one == six
    for sent, ring in one:
        assert ring <= sent <= ring + 16, (sent, ring)


def _memory_rank(comm):
    mesh = md.DeviceMesh(comm, {"dp": 2, "pp": 4})
    model = HybridGPT(CFG, mesh, 2, dtype=torch.float64, **SGD)
    model.step(*DATA[0])
    return mesh.coords, model.memory()


def test_each_rank_holds_only_its_stage():
    """Over the 4 stages of one replica the parameter, gradient and momentum bytes add up to
    the full model's, each once: no rank keeps the layers of another stage."""
    full = sum(p.numel() for p in GPT(CFG).parameters()) * 8
    results = md.launch(_memory_rank, 8, timeout=60)
    for d in range(2):
        stages = [mem for coords, mem in results if coords["dp"] == d]
        for kind in ("params", "grads", "optimizer"):
            assert sum(m[kind] for m in stages) == full, kind
        assert all(m["params"] < full / 2 for m in stages)


def _errors_rank(comm):
    tied = GPTConfig(**{**CFG.__dict__, "tie_weights": True})
    attempts = {
        "tied": lambda: HybridGPT(tied, md.DeviceMesh(comm, {"pp": 2, "dp": 2})),
        "zero2 pp": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"pp": 2, "dp": 2}),
                                      zero_stage=2),
        "zero3 tp": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"tp": 2, "dp": 2}),
                                      zero_stage=3),
        "zero9": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"dp": 4}), zero_stage=9),
        "dim": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"dp": 2, "cp": 2})),
        "mesh": lambda: HybridGPT(CFG, comm),
        "micro": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"dp": 4}), microbatches=0),
        "schedule": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"pp": 4}),
                                      schedule="interleaved"),
        "batch": lambda: HybridGPT(CFG, md.DeviceMesh(comm, {"dp": 4})).step(
            DATA[0][0][:6], DATA[0][1][:6]),
        "tp heads": lambda: HybridGPT(GPTConfig(n_head=2, n_embd=8, tie_weights=False),
                                      md.DeviceMesh(comm, {"tp": 4})),
    }
    out = {}
    for key, attempt in attempts.items():
        try:
            attempt()
            out[key] = None
        except (ValueError, TypeError) as e:
            out[key] = f"{type(e).__name__}: {e}"
    return out


def test_bad_layouts_name_the_mistake():
    got = md.launch(_errors_rank, 4, timeout=60)[0]
    want = {
        "tied": "ValueError: pp=2: a head tied to the embedding cannot be split across "
                "pipeline stages; use GPTConfig(tie_weights=False)",
        "zero2 pp": "ValueError: zero_stage=2 with pp=2: ZeRO 2 and 3 reduce-scatter the "
                    "gradients",
        "zero3 tp": "ValueError: zero_stage=3 with tp=2",
        "zero9": "ValueError: zero_stage must be one of None, 0, 1, 2, 3, got 9",
        "dim": "ValueError: HybridGPT knows the mesh dimensions ('dp', 'pp', 'tp'), got ['cp']",
        "mesh": "TypeError: mesh must be an md.DeviceMesh, got Communicator",
        "micro": "ValueError: microbatches must be a positive integer, got 0",
        "schedule": "ValueError: schedule must be one of 'naive', 'gpipe', '1f1b', "
                    "got 'interleaved'",
        "batch": "ValueError: x must be a tensor whose batch size (dim 0) divides into dp=4 "
                 "equal slices, got (6, 8)",
        "tp heads": "ValueError: n_head=2 is not divisible by the tensor-parallel world size 4",
    }
    for key, start in want.items():
        assert got[key] is not None and got[key].startswith(start), (key, got[key])
