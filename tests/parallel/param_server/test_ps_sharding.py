"""The shard plan and the cost formulas, without any process.

Plan: every element of every tensor is owned by exactly one server; a tensor above the
threshold is sliced across all servers; every server's load is within one small tensor of
N/S (Graham's LPT bound); pack and unpack are inverse. Costs: the formulas' own values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.costmodel.dp import ring_all_reduce_bytes_per_rank, ring_step_time
from minidist.costmodel.ps import ps_server_ingress_bytes, ps_step_time
from minidist.parallel.param_server import plan_shards
from minidist.parallel.param_server.sharding import BIG_PIECE

shapes_st = st.lists(st.lists(st.sampled_from([0, 1, 2, 3, 7, 9, 200]), min_size=0,
                              max_size=3).map(tuple), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(shapes=shapes_st, servers=st.integers(1, 5), threshold=st.one_of(st.none(),
                                                                        st.integers(1, 60_000)))
def test_plan_covers_every_element_once_and_balances(shapes, servers, threshold):
    plan = plan_shards(shapes, servers, threshold)
    sizes = [torch.Size(s).numel() for s in shapes]
    owners = [torch.zeros(n, dtype=torch.int64) for n in sizes]
    for s in range(servers):
        pieces = plan.shards[s]
        assert list(pieces) == sorted(pieces, key=lambda p: (p.numel < BIG_PIECE, p.tensor,
                                                             p.start))
        segments = plan.segments(s)
        assert [q for g in segments for q in g.pieces] == list(pieces)
        assert [g.start for g in segments] + [plan.numel(s)] == \
            [0] + [g.stop for g in segments]
        assert sum(not g.in_place for g in segments) <= 1  # the small ones travel together
        for p in pieces:
            owners[p.tensor][p.start:p.stop] += 1
    assert all(bool((o == 1).all()) for o in owners)
    whole = [n for n in sizes if threshold is None or n <= threshold or servers == 1]
    mean = sum(sizes) / servers
    for load in plan.sizes():
        assert abs(load - mean) <= max(whole, default=0) + 1  # +1: the slices' remainders
    for i, n in enumerate(sizes):
        if threshold is not None and n > threshold and servers > 1:
            assert sorted(p.tensor for sh in plan.shards for p in sh).count(i) == servers


def test_big_tensor_sliced_like_mxnet():
    plan = plan_shards([(10, 10), (3,), (7,)], 3, slice_threshold=50)
    assert [[(p.tensor, p.start, p.stop) for p in sh] for sh in plan.shards] == \
        [[(0, 0, 34)], [(0, 34, 67), (2, 0, 7)], [(0, 67, 100), (1, 0, 3)]]
    assert plan.sizes() == [34, 40, 36]  # the small ones went to the least loaded


def test_naive_single_server_holds_everything():
    plan = plan_shards([(4, 3), (4,), (2, 4)], 1, slice_threshold=1)
    assert [(p.tensor, p.start, p.stop) for p in plan.shards[0]] == \
        [(0, 0, 12), (1, 0, 4), (2, 0, 8)]


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_pack_unpack_roundtrip(servers):
    torch.manual_seed(0)
    tensors = [torch.randn(5, 6), torch.randn(7), torch.randn(2, 2, 3)]
    plan = plan_shards([tuple(t.shape) for t in tensors], servers, slice_threshold=10)
    out = [torch.zeros_like(t) for t in tensors]
    for s in range(servers):
        flat = plan.pack(s, tensors)
        assert flat.numel() == plan.numel(s)
        plan.unpack(s, flat, out)
    for a, b in zip(out, tensors):
        assert torch.equal(a, b)


def test_plan_rejects_bad_server_count():
    with pytest.raises(ValueError, match="num_servers must be a positive integer, got 0"):
        plan_shards([(3,)], 0)


def test_cost_formulas():
    n = 100e6  # bytes
    assert ps_server_ingress_bytes(8, n, 1) == 8 * n
    assert ps_server_ingress_bytes(8, n, 4) == 2 * n
    assert ring_all_reduce_bytes_per_rank(8, n) == pytest.approx(1.75 * n)
    assert ring_all_reduce_bytes_per_rank(1, n) == 0
    bw = 1.25e9  # 10 Gb/s
    assert ps_step_time(8, n, 1, bw) == pytest.approx(2 * 8 * n / bw)
    assert ps_step_time(2, n, 4, bw, latency=1e-5) == pytest.approx(2 * (1e-5 + n / bw))
    assert ps_step_time(8, n, 1, bw, pipelined=True) == pytest.approx(9 * n / bw)
    assert ps_step_time(8, n, 4, bw, 1e-5, pipelined=True) == pytest.approx(2e-5 + 3 * n / bw)
    assert ring_step_time(8, n, bw, latency=1e-5) == pytest.approx(14e-5 + 1.75 * n / bw)
    # the bottleneck: one server is W^2/(W-1) times slower than the ring; S servers divide
    # that by S, down to the workers' own links at S = W
    assert ps_step_time(8, n, 1, bw) / ring_step_time(8, n, bw) == pytest.approx(64 / 7)
    assert ps_step_time(8, n, 4, bw) / ring_step_time(8, n, bw) == pytest.approx(16 / 7)
    assert ps_step_time(8, n, 8, bw) / ring_step_time(8, n, bw) == pytest.approx(8 / 7)
    with pytest.raises(ValueError, match="workers must be a positive integer, got 0"):
        ps_server_ingress_bytes(0, n)
    with pytest.raises(ValueError, match="bandwidth must be a positive number"):
        ps_step_time(2, n, 1, 0)
