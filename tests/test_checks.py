"""``minidist.checks``: each check accepts what it promises, refuses the rest with a message
naming the argument and the value, and the token-id range check reads the device once."""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from minidist import checks

SYNCS = {"item", "tolist", "__int__", "__bool__", "__float__", "__index__"}


class HostReads(TorchFunctionMode):
    """Counts the tensor methods that copy a value to the host (a GPU stream waits for each)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_integer_accepts_whole_numbers_and_names_the_rest():
    assert checks.positive_int(3, "n") == 3 and type(checks.positive_int(3, "n")) is int
    assert checks.integer(0, "epoch", low=0) == 0
    for bad, error in ((0, ValueError), (-1, ValueError), (2.0, ValueError), (True, ValueError),
                       ("2", ValueError)):
        with pytest.raises(error, match=f"n must be a positive integer, got {bad!r}"):
            checks.positive_int(bad, "n")
    with pytest.raises(TypeError, match="stages must be a positive integer, got 1.5"):
        checks.positive_int(1.5, "stages", TypeError)
    with pytest.raises(ValueError, match="epoch must be a non-negative integer, got -1"):
        checks.integer(-1, "epoch", low=0)
    with pytest.raises(ValueError, match="--world-size must be an integer >= 2, got 1"):
        checks.integer(1, "--world-size", low=2)


def test_positive_number_units_and_finiteness():
    assert checks.positive_number(0.5, "t") == 0.5 and checks.positive_number(math.inf, "t")
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got 0"):
        checks.positive_number(0, "timeout", unit="seconds")
    with pytest.raises(ValueError, match="scale must be a positive finite number, got inf"):
        checks.positive_number(math.inf, "scale", finite=True)
    for bad in (math.nan, True, "1"):
        with pytest.raises(ValueError, match="x must be a positive number"):
            checks.positive_number(bad, "x")


def test_one_of_and_the_zero_rules():
    assert checks.one_of("ring", ("ring", "tree"), "algorithm") == "ring"
    with pytest.raises(ValueError, match=r"algorithm must be one of 'ring', 'tree', got 'x'"):
        checks.one_of("x", ("ring", "tree"), "algorithm")
    with pytest.raises(ValueError, match=r"stage must be one of 0, 1, 2, 3, got True"):
        checks.zero_stage(True)
    with pytest.raises(ValueError, match=r"zero_stage must be one of None, 0, 1, 2, 3, got 4"):
        checks.zero_stage(4, "zero_stage", optional=True)
    checks.zero_with_pipeline(1, 4)
    checks.zero_with_pipeline(3, 1)
    with pytest.raises(ValueError, match="zero_stage=2 with pp=2: ZeRO 2 and 3"):
        checks.zero_with_pipeline(2, 2)


def test_tensor_and_int_list():
    t = torch.zeros(2)
    assert checks.tensor(t, "x") is t
    with pytest.raises(TypeError, match="x must be a tensor, got list"):
        checks.tensor([1.0], "x")
    assert checks.int_list("1,2,4", "--world-sizes") == [1, 2, 4]
    with pytest.raises(ValueError, match="--world-sizes takes positive integers separated by "
                                         "commas, got '1,a'"):
        checks.int_list("1,a", "--world-sizes")
    with pytest.raises(ValueError, match="--world-sizes must be a positive integer, got 0"):
        checks.int_list("2,0", "--world-sizes")


def test_token_ids_one_host_read_and_the_range_found():
    ids = torch.tensor([[0, 5, 7], [3, 2, 1]])
    with HostReads() as reads:
        checks.token_ids(ids, 8, "ids")
    assert reads.calls == ["tolist"]  # one copy to the host for both bounds
    checks.token_ids(torch.empty(0, dtype=torch.long), 8, "ids")  # nothing to check
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 8\), got \[-1, 7\]"):
        checks.token_ids(torch.tensor([-1, 7]), 8, "ids")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 8\), got \[0, 8\]"):
        checks.token_ids(torch.tensor([0, 8]), 8, "ids")


def test_the_old_two_read_check_is_what_this_replaces():
    """The oracle for the count above: reading min and max separately is two host reads."""
    ids = torch.tensor([0, 5, 7])
    with HostReads() as reads:
        int(ids.min()), int(ids.max())
    assert len(reads.calls) == 2


def test_rank_names_the_argument_and_the_valid_range():
    import numpy as np

    assert checks.rank(np.int64(2), 4, "dst") == 2  # numpy's integers are ranks too
    with pytest.raises(TypeError, match="dst must be an integer rank, got float"):
        checks.rank(1.0, 4, "dst")
    with pytest.raises(TypeError, match="got bool"):
        checks.rank(True, 4, "dst")
    with pytest.raises(ValueError, match="src=4 is outside the communicator: world_size is 4, "
                                         "so valid ranks are 0..3"):
        checks.rank(4, 4, "src")
