"""Megatron's parallel layers equal the full layers they are built from, on 1, 2 and 4 ranks:
outputs, the input's gradient, every parameter's gradient gathered back, and the parameters
after several SGD steps (float64); the vocabulary-parallel cross-entropy equals
``F.cross_entropy``; the f / g operators make exactly the all-reduces Megatron-LM counts; bad
input gets a clear error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minidist as md
from minidist.costmodel import collectives as costs
from minidist.costmodel.tp import op_cost
from minidist.parallel.tensor import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    split_to_parallel,
    vocab_parallel_cross_entropy,
)

B, S, H, OUT, V = 2, 3, 8, 12, 16  # batch, sequence, in features, out features, vocabulary
STEPS = 3
TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def _linear(in_f: int, out_f: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_f, out_f, bias=bias).double()


def _inputs(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _run(layer, x: torch.Tensor, upstream: torch.Tensor):
    """One forward and backward with a fixed upstream gradient; (output, input's grad)."""
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(upstream)
    return y.detach(), x.grad


def _train(layer, xs, ups, lr: float = 0.1) -> None:
    opt = torch.optim.SGD(layer.parameters(), lr=lr, momentum=0.9)
    for x, up in zip(xs, ups):
        opt.zero_grad()
        layer(x).backward(up)
        opt.step()


def _compare_linear(comm, full: nn.Linear, make, in_slice: bool, out_slice: bool) -> None:
    """``make(full)`` against ``full``: one step's output, gradients, then STEPS SGD steps.
    ``in_slice``/``out_slice``: the sharded layer reads / writes its rank's last-dim slice."""
    shard = make(full)
    x, up = _inputs(1, B, S, full.in_features), _inputs(2, B, S, full.out_features)
    y_full, gx_full = _run(full, x, up)
    cut = lambda t: t.chunk(comm.world_size, -1)[comm.rank]  # noqa: E731
    y, gx = _run(shard, cut(x) if in_slice else x, cut(up) if out_slice else up)
    torch.testing.assert_close(y, cut(y_full) if out_slice else y_full, **TIGHT)
    torch.testing.assert_close(gx, cut(gx_full) if in_slice else gx_full, **TIGHT)
    torch.testing.assert_close(shard.full_weight(grad=True), full.weight.grad, **TIGHT)
    if full.bias is not None:
        torch.testing.assert_close(shard.full_bias(grad=True), full.bias.grad, **TIGHT)
    xs = [_inputs(10 + k, B, S, full.in_features) for k in range(STEPS)]
    ups = [_inputs(20 + k, B, S, full.out_features) for k in range(STEPS)]
    _train(full, xs, ups)
    _train(shard, [cut(x) for x in xs] if in_slice else xs,
           [cut(u) for u in ups] if out_slice else ups)
    torch.testing.assert_close(shard.full_weight(), full.weight.detach(), **TIGHT)
    if full.bias is not None:
        torch.testing.assert_close(shard.full_bias(), full.bias.detach(), **TIGHT)


def _layers_rank(comm):
    for bias in (True, False):
        for gather in (False, True):
            _compare_linear(comm, _linear(H, OUT, bias, 0), lambda f, g=gather:
                            md.ColumnParallelLinear.from_full(f, comm, gather_output=g),
                            in_slice=False, out_slice=not gather)
        for parallel in (True, False):
            _compare_linear(comm, _linear(H, OUT, bias, 1), lambda f, par=parallel:
                            md.RowParallelLinear.from_full(f, comm, input_is_parallel=par),
                            in_slice=parallel, out_slice=False)
    _compare_embedding(comm)
    _compare_mlp(comm)
    _compare_cross_entropy(comm)


def _compare_embedding(comm) -> None:
    torch.manual_seed(3)
    full = nn.Embedding(V, H).double()
    shard = md.VocabParallelEmbedding.from_full(full, comm)
    idx = torch.randint(V, (B, S), generator=torch.Generator().manual_seed(4))
    up = _inputs(5, B, S, H)
    y_full = full(idx)
    y_full.backward(up)
    y = shard(idx)
    y.backward(up)
    torch.testing.assert_close(y, y_full, **TIGHT)
    torch.testing.assert_close(shard.full_weight(grad=True), full.weight.grad, **TIGHT)


def _compare_mlp(comm) -> None:
    """Column then row: Megatron's MLP, no communication between the two linears."""
    fc, proj = _linear(H, 4 * H, True, 6), _linear(4 * H, H, True, 7)
    full = nn.Sequential(fc, nn.GELU(), proj)
    par = nn.Sequential(md.ColumnParallelLinear.from_full(fc, comm), nn.GELU(),
                        md.RowParallelLinear.from_full(proj, comm))
    x, up = _inputs(8, B, S, H), _inputs(9, B, S, H)
    y_full, gx_full = _run(full, x, up)
    y, gx = _run(par, x, up)
    torch.testing.assert_close(y, y_full, **TIGHT)
    torch.testing.assert_close(gx, gx_full, **TIGHT)
    torch.testing.assert_close(par[0].full_weight(grad=True), fc.weight.grad, **TIGHT)
    torch.testing.assert_close(par[2].full_weight(grad=True), proj.weight.grad, **TIGHT)


def _compare_cross_entropy(comm) -> None:
    for scale in (1.0, 80.0):  # large logits: the max subtraction must keep exp finite
        logits = (scale * _inputs(11, B, S, V)).requires_grad_(True)
        targets = torch.randint(V, (B, S), generator=torch.Generator().manual_seed(12))
        want = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        want.backward()
        mine = logits.detach().chunk(comm.world_size, -1)[comm.rank].requires_grad_(True)
        got = vocab_parallel_cross_entropy(mine, targets, comm)
        (2.0 * got).backward()  # a non-unit upstream gradient reaches every column
        torch.testing.assert_close(got, want.detach(), **TIGHT)
        torch.testing.assert_close(
            mine.grad, 2.0 * logits.grad.chunk(comm.world_size, -1)[comm.rank], **TIGHT)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_layers_match_full_layers(world_size):
    md.launch(_layers_rank, world_size, timeout=60)


# -- the operators' communication, counted --------------------------------------------------------
def _operators_rank(comm):
    """Bytes and messages of each operator, forward then backward, with the ring."""
    p, r, n = comm.world_size, comm.rank, B * S * H
    ring = costs.ring_bytes(n, 8, p, r)
    gather = costs.all_gather_bytes(n // p, 8, p, r)
    counted = {}
    for name, fn, forward, backward in (
            ("copy", lambda x: copy_to_parallel(x, comm, "ring"), 0, ring),
            ("reduce", lambda x: reduce_from_parallel(x, comm, "ring"), ring, 0),
            ("split", lambda x: split_to_parallel(x, comm), 0, gather),
            ("gather", lambda x: gather_from_parallel(x.chunk(p, -1)[r], comm), gather, 0)):
        x = _inputs(13, B, S, H).requires_grad_(True)
        comm.stats.reset()
        y = fn(x)
        fwd = comm.stats.bytes_sent
        y.backward(torch.ones_like(y))
        counted[name] = (fwd, comm.stats.bytes_sent - fwd)
        assert counted[name] == (forward, backward), (name, counted[name])
        if name == "copy":  # the all-reduce backward sums the p ranks' gradients
            torch.testing.assert_close(x.grad, torch.full_like(x, float(p)))
    return counted


@pytest.mark.parametrize("world_size", [2, 4])
def test_operators_communicate_as_their_costs_say(world_size):
    md.launch(_operators_rank, world_size, timeout=60)
    cost = op_cost("copy", 1e6, world_size, alpha=1e-5, beta=1e9)
    assert cost["forward"] == 0 and cost["backward"] == pytest.approx(
        costs.time("ring", 1e6, world_size, 1e-5, 1e9))
    with pytest.raises(ValueError, match="unknown operator 'scatter'"):
        op_cost("scatter", 1.0, 2, 1.0, 1.0)


# -- bad input ------------------------------------------------------------------------------------
def _errors_rank(comm):
    with pytest.raises(ValueError, match="out_features=10 is not divisible by the tensor-parallel "
                                         "world size 4"):
        md.ColumnParallelLinear.from_full(nn.Linear(4, 10), comm)
    with pytest.raises(ValueError, match="in_features=6 is not divisible"):
        md.RowParallelLinear.from_full(nn.Linear(6, 4), comm)
    with pytest.raises(ValueError, match=r"vocab_size \(num_embeddings\)=10 is not divisible"):
        md.VocabParallelEmbedding.from_full(nn.Embedding(10, 4), comm)
    with pytest.raises(TypeError, match="expected a torch.nn.Linear, got Embedding"):
        md.ColumnParallelLinear.from_full(nn.Embedding(8, 4), comm)
    with pytest.raises(ValueError, match="expected this rank's slice of 2"):
        md.RowParallelLinear.from_full(nn.Linear(8, 4), comm)(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 8\), got \[0, 9\]"):
        vocab_parallel_cross_entropy(torch.randn(2, 2), torch.tensor([0, 9]), comm)
    with pytest.raises(ValueError, match="logits .* and targets .* disagree"):
        vocab_parallel_cross_entropy(torch.randn(2, 2), torch.tensor([0, 1, 2]), comm)
    with pytest.raises(TypeError, match="targets must be integer token ids"):
        vocab_parallel_cross_entropy(torch.randn(2, 2), torch.tensor([0.0, 1.0]), comm)
    with pytest.raises(ValueError, match=r"rows must be 2 distinct output rows in \[0, 8\)"):
        md.ColumnParallelLinear.from_full(nn.Linear(4, 8), comm, rows=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 8\), got \[0, 8\]"):
        md.VocabParallelEmbedding.from_full(nn.Embedding(8, 4), comm)(torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="no backward has run yet"):
        md.ColumnParallelLinear.from_full(nn.Linear(4, 8), comm).full_weight(grad=True)


def test_bad_input_gets_clear_errors():
    md.launch(_errors_rank, 4, timeout=60)
