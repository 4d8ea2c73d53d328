"""``Measured``: any hook's bytes (counted by comm.stats) and its error against the true
average; fp16 halves the bytes of the float32 average at a relative error near 2^-11."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import minidist as md
from minidist.compression import Measured, fp16_hook
from minidist.compression.hook_reports import StepLog
from minidist.parallel.data.buckets import allreduce_hook


def _rank(comm):
    plain, half = Measured(allreduce_hook, exact_error=True), Measured(fp16_hook, True)
    for step in range(2):
        for index, n in enumerate((1000, 300)):
            g = torch.randn(n, generator=torch.Generator().manual_seed(10 * comm.rank + step))
            plain(comm, SimpleNamespace(buffer=g.clone(), index=index))
            half(comm, SimpleNamespace(buffer=g.clone(), index=index))
    return plain.report(), half.report()


def test_fp16_halves_bytes_with_small_error():
    for plain, half in md.launch(_rank, 2, timeout=60):
        assert plain["steps"] == half["steps"] == 2
        assert plain["bytes_sent"] == plain["dense_bytes"] == 1300 * 4  # p = 2: n per rank
        assert half["bytes_sent"] * 2 == plain["bytes_sent"]
        assert plain["total_bytes_sent"] == 2 * plain["bytes_sent"]
        assert plain["relative_error"] < 1e-6  # float32 rounding of the same sums
        assert 1e-5 < half["relative_error"] < 2.0**-10  # float16 rounding


def test_empty_log_and_bad_hook():
    assert StepLog().summary()["steps"] == 0
    with pytest.raises(TypeError, match="hook must be callable"):
        Measured("fp16")
