"""``rules.RunningMean`` (the server adds gradients up as pushes arrive) against
``rules.average`` (all at once): the same bits, whatever order the pushes arrive in and
whoever has left, and nothing added past a worker that has not pushed yet."""

from __future__ import annotations

import itertools

import pytest
import torch

from minidist.parallel.param_server.rules import RunningMean, average


def grads(workers, n=1000):
    g = torch.Generator().manual_seed(0)
    return {w: torch.randn(n, generator=g, dtype=torch.float32) * 10 ** (w % 5)
            for w in workers}


@pytest.mark.parametrize("arrival", list(itertools.permutations([2, 3, 4, 5])))
def test_same_bits_as_average_in_any_arrival_order(arrival):
    g = grads(arrival)
    want = average([g[w].clone() for w in sorted(arrival)])
    mean, heads, active = RunningMean(), {}, set(arrival)
    for w in arrival:
        heads[w] = g[w].clone()
        mean.catch_up(heads, active)
        # only a prefix of the worker order is ever added
        assert mean.members == sorted(arrival)[:len(mean.members)]
        assert all(v in heads for v in mean.members)
    assert torch.equal(mean.finish(heads, sorted(arrival)), want)


def test_waits_for_an_active_worker_and_skips_one_that_left():
    g = grads([1, 2, 3])
    mean = RunningMean()
    mean.catch_up({2: g[2].clone(), 3: g[3].clone()}, {1, 2, 3})
    assert mean.members == []  # worker 1 has not pushed: nothing can be added yet
    mean.catch_up({2: g[2].clone(), 3: g[3].clone()}, {2, 3})  # worker 1 left, empty
    assert mean.members == [2, 3]
    heads = {2: g[2].clone(), 3: g[3].clone()}
    got = RunningMean()
    got.catch_up(heads, {2, 3})
    assert torch.equal(got.finish(heads, [2, 3]), average([g[2].clone(), g[3].clone()]))


def test_members_that_disagree_are_an_error():
    g = grads([1, 2])
    mean = RunningMean()
    heads = {1: g[1], 2: g[2]}
    mean.catch_up(heads, {1, 2})
    with pytest.raises(RuntimeError, match=r"summed workers \[1, 2\], but its members are \[1\]"):
        mean.finish(heads, [1])
