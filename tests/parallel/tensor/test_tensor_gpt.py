"""``md.parallelize_gpt``: the small GPT split Megatron's way trains exactly like the full
model on 1, 2 and 4 ranks (logits, loss, every parameter's gradient gathered back, several
AdamW steps; float64, tied and untied head), makes exactly 4 all-reduces of b*s*h elements
per block per training step (2 forward, 2 backward) as ``comm.stats`` counts them, holds the
parameters ``costmodel.tp.param_counts`` predicts, and refuses what it cannot split."""

from __future__ import annotations

import pytest
import torch

import minidist as md
from minidist.costmodel import collectives as collective_costs
from minidist.costmodel import tp as costs
from minidist.costmodel.tp import megatron_mlp_bytes, naive_mlp_bytes
from minidist.models import GPT, GPTConfig, synthetic_tokens

CFG = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_embd=16)
B, S, STEPS = 2, 8, 3
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def _full(cfg: GPTConfig) -> GPT:
    return GPT(cfg).double()


def _compare(comm, cfg: GPTConfig, seq: int = S, **layout) -> None:
    """The sharded model against the full one, both trained here on the same batches."""
    full = _full(cfg)
    tp = md.parallelize_gpt(full, comm, algorithm="ring", **layout)
    data = synthetic_tokens(STEPS, B, seq, cfg.vocab_size, seed=1)
    opt_full = torch.optim.AdamW(full.parameters(), lr=1e-2)
    opt_tp = torch.optim.AdamW(tp.parameters(), lr=1e-2)
    for step, (x, y) in enumerate(data):
        opt_full.zero_grad()
        opt_tp.zero_grad()
        logits_full, loss_full = full(x, y)
        loss_full.backward()
        logits, loss = tp(x, y, gather_logits=True)
        loss.backward()
        torch.testing.assert_close(loss, loss_full, **TIGHT)
        torch.testing.assert_close(logits, logits_full, **TIGHT)
        grads = tp.full_parameters(grad=True)
        assert list(grads) == [n for n, _ in full.named_parameters()]
        for name, p in full.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, **TIGHT, msg=f"{name} at {step}")
        opt_full.step()
        opt_tp.step()
    params = tp.full_parameters()
    for name, p in full.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), **TIGHT, msg=name)


def _equivalence_rank(comm):
    _compare(comm, CFG)
    _compare(comm, GPTConfig(**{**CFG.__dict__, "tie_weights": False, "bias": False}))
    _compare(comm, CFG, naive_mlp=True)
    _compare(comm, CFG, sequence_parallel=True)
    _compare(comm, GPTConfig(**{**CFG.__dict__, "tie_weights": False, "bias": False}),
             sequence_parallel=True)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_gpt_matches_full_model(world_size):
    """Megatron's layout, tied and untied, with and without biases; the naive MLP; sequence
    parallelism (whose LayerNorm, position and bias gradients are summed by hooks)."""
    md.launch(_equivalence_rank, world_size, timeout=60)


def _three_rank(comm):
    cfg = GPTConfig(vocab_size=33, block_size=6, n_layer=1, n_head=3, n_embd=24)
    _compare(comm, cfg, seq=6)
    _compare(comm, cfg, seq=6, sequence_parallel=True)


def test_gpt_on_three_ranks():
    """A world size that is not a power of two (rings of 3; 33 tokens, 3 heads)."""
    md.launch(_three_rank, 3, timeout=60)


# -- communication per block and per step, read from comm.stats -----------------------------------
def _counted(comm, fn) -> tuple[int, int]:
    comm.stats.reset()
    fn()
    return comm.stats.bytes_sent, comm.stats.messages_sent


def _block_rank(comm, layout: str):
    p, r = comm.world_size, comm.rank
    sequence = layout == "sequence_parallel"
    tp = md.parallelize_gpt(_full(CFG), comm, algorithm="ring", naive_mlp=layout == "naive_mlp",
                            sequence_parallel=sequence)
    block = tp.model.transformer.h[0]
    x = torch.randn(B, S // p if sequence else S, CFG.n_embd, dtype=torch.float64,
                    requires_grad=True)
    out = {}
    out["forward"] = _counted(comm, lambda: out.setdefault("y", block(x)))
    assert out.pop("y").shape == x.shape  # sequence parallel: the stream stays on s/p tokens
    y = block(x)
    out["backward"] = _counted(comm, lambda: y.backward(torch.ones_like(y)))
    idx, tgt = synthetic_tokens(1, B, S, CFG.vocab_size, seed=2)[0]
    out["step"] = _counted(comm, lambda: tp(idx, tgt)[1].backward())
    bsh = B * S * CFG.n_embd
    out["ring"] = collective_costs.ring_bytes(bsh, 8, p, r)
    out["gather_and_scatter"] = (collective_costs.all_gather_bytes(bsh // p, 8, p, r)
                                 + collective_costs.reduce_scatter_bytes(bsh, 8, p, r))
    out["hook"] = collective_costs.ring_bytes(CFG.n_embd, 8, p, r)
    out["step_formula"] = costs.step_bytes(CFG, B, S, 8, p, r, layout)
    out["naive_mlp"] = naive_mlp_bytes(B * S, CFG.n_embd, 8, p, r)
    out["megatron_mlp"] = megatron_mlp_bytes(B * S, CFG.n_embd, 8, p, r)
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_four_all_reduces_of_bsh_per_block(world_size):
    messages = 2 * (world_size - 1)  # a ring all-reduce sends 2(p-1) messages
    for got in md.launch(_block_rank, world_size, args=("megatron",), timeout=60):
        assert got["forward"] == (2 * got["ring"], 2 * messages)  # g after attention, after MLP
        assert got["backward"] == (2 * got["ring"], 2 * messages)  # f before each of them
        assert got["step"][0] == got["step_formula"]
        assert got["step"][1] == (4 * CFG.n_layer + 2 + 3) * messages


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_block_moves_the_bytes_of_four_all_reduces(world_size):
    """2 all-gathers and 2 reduce-scatters each way, (p-1) messages each; backward adds the
    hooks' all-reduces of the 6 partial gradients of h elements (LayerNorms, biases)."""
    for got in md.launch(_block_rank, world_size, args=("sequence_parallel",), timeout=60):
        assert got["gather_and_scatter"] == got["ring"]  # the same bytes as one all-reduce
        assert got["forward"] == (2 * got["ring"], 4 * (world_size - 1))
        assert got["backward"][0] == 2 * got["ring"] + 6 * got["hook"]
        assert got["step"][0] == got["step_formula"]


def test_naive_mlp_sends_the_bytes_its_formula_says():
    for got in md.launch(_block_rank, 2, args=("naive_mlp",), timeout=60):
        block_bytes = got["forward"][0] + got["backward"][0]
        assert block_bytes == got["ring"] * 2 + got["naive_mlp"]  # attention is Megatron's
        assert got["naive_mlp"] == 15 * got["megatron_mlp"] // 4  # 15 vs 4 (p-1)/p bsh
        assert got["step"][0] == got["step_formula"]


# -- memory per rank ------------------------------------------------------------------------------
def _memory_rank(comm):
    out = []
    for cfg in (CFG, GPTConfig(**{**CFG.__dict__, "tie_weights": False, "bias": False})):
        tp = md.parallelize_gpt(GPT(cfg), comm)
        held = sum(p.numel() for p in tp.parameters())
        out.append((held, costs.param_counts(cfg, comm.world_size), GPT(cfg).num_params()))
    return out


@pytest.mark.parametrize("world_size", [1, 4])
def test_parameters_per_rank_match_the_formula(world_size):
    for rank_out in md.launch(_memory_rank, world_size, timeout=60):
        for held, formula, full in rank_out:
            assert held == formula["per_rank"] and formula["full"] == full


# -- what cannot be split -------------------------------------------------------------------------
def _errors_rank(comm):
    with pytest.raises(ValueError, match="n_head=2 is not divisible by the tensor-parallel world "
                                         "size 4"):
        md.parallelize_gpt(GPT(GPTConfig(n_head=2, n_embd=16, vocab_size=32)), comm)
    with pytest.raises(ValueError, match="vocab_size=30 is not divisible"):
        md.parallelize_gpt(GPT(GPTConfig(n_head=4, n_embd=16, vocab_size=30)), comm)
    with pytest.raises(ValueError, match="dropout=0.1 is not supported"):
        md.parallelize_gpt(GPT(GPTConfig(n_head=4, n_embd=16, vocab_size=32, dropout=0.1)), comm)
    with pytest.raises(TypeError, match="expected an md.models.GPT, got Linear"):
        md.parallelize_gpt(torch.nn.Linear(2, 2), comm)
    with pytest.raises(ValueError, match="naive_mlp and sequence_parallel do not combine"):
        md.parallelize_gpt(GPT(CFG), comm, naive_mlp=True, sequence_parallel=True)
    sp = md.parallelize_gpt(GPT(CFG), comm, sequence_parallel=True)
    with pytest.raises(ValueError, match="sequence length 6 is not divisible by the "
                                         "tensor-parallel world size 4"):
        sp(torch.zeros(2, 6, dtype=torch.long))


def test_what_cannot_be_split_is_refused_clearly():
    md.launch(_errors_rank, 4, timeout=60)
