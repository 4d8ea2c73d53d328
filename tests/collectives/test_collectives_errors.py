"""Bad calls get a clear error on every rank, never a hang or silent garbage, and the
communicator stays usable afterwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minidist as md


def _on_every_rank(comm, calls):
    """Run each call; return (exception type, message) per call, then prove the
    communicator still works with one correct all_reduce."""
    out = []
    for call in calls:
        try:
            call(comm)
            out.append(None)
        except Exception as e:  # report whatever was raised
            out.append((type(e).__name__, str(e)))
    x = torch.full((5,), float(comm.rank))
    md.all_reduce(comm, x, algorithm="ring")
    return out, x.tolist()


# Each call is run by every rank; ``comm.rank`` makes them differ where the test wants.
MISMATCHES = {
    "length": lambda c: md.all_reduce(c, torch.zeros(10 + (c.rank == 0))),
    "dtype": lambda c: md.all_reduce(c, torch.zeros(4, dtype=torch.float64 if c.rank else
                                                    torch.float32)),
    "shape, same numel": lambda c: md.all_reduce(c, torch.zeros((2, 5) if c.rank else (5, 2))),
    "op": lambda c: md.all_reduce(c, torch.zeros(3), op="max" if c.rank == 1 else "sum"),
    "algorithm": lambda c: md.all_reduce(c, torch.zeros(3),
                                         algorithm="tree" if c.rank else "ring"),
    "root": lambda c: md.broadcast(c, torch.zeros(3), src=c.rank % 2),
    "collective": lambda c: (md.broadcast if c.rank else md.all_reduce)(c, torch.zeros(3)),
    "not a tensor": lambda c: md.all_reduce(c, [1.0, 2.0] if c.rank == 2 else torch.zeros(2)),
    "non-contiguous": lambda c: md.all_reduce(c, torch.zeros(4, 4)[:, 0] if c.rank == 2 else
                                              torch.zeros(4)),
    "scatter pieces": lambda c: md.scatter(c, torch.zeros(2, 3) if c.rank == 0 else
                                           torch.zeros(3)),
    "gather shape": lambda c: md.gather(c, torch.zeros(c.rank + 1)),
}

INVALID = {  # the same bad call on every rank: every rank raises the same error
    "integer avg": (lambda c: md.all_reduce(c, torch.zeros(3, dtype=torch.int32), op="avg"),
                    "TypeError", "op='avg' of int32 tensors is not defined"),
    "unknown op": (lambda c: md.all_reduce(c, torch.zeros(3), op="mean"),
                   "ValueError", "unknown op 'mean'; choose one of sum, avg, max, min, prod"),
    "unknown algorithm": (lambda c: md.all_reduce(c, torch.zeros(3), algorithm="butterfly"),
                          "ValueError", "unknown algorithm 'butterfly'"),
    "bool reduce": (lambda c: md.reduce(c, torch.zeros(3, dtype=torch.bool)),
                    "TypeError", "cannot reduce bool tensors"),
    "root out of range": (lambda c: md.gather(c, torch.zeros(3), dst=7),
                          "ValueError", "dst=7 is outside the communicator"),
    "root not an int": (lambda c: md.broadcast(c, torch.zeros(3), src="0"),
                        "TypeError", "src must be an integer rank"),
    "all_to_all rows": (lambda c: md.all_to_all(c, torch.zeros(2, 3)),
                        "ValueError", "pass one row per rank along the first axis"),
    "reduce_scatter scalar": (lambda c: md.reduce_scatter(c, torch.tensor(1.0)),
                              "ValueError", "no axis to split"),
    "list": (lambda c: md.all_gather(c, [1, 2]),
             "TypeError", "must be a torch.Tensor or a numpy.ndarray"),
    "big-endian numpy": (lambda c: md.broadcast(c, np.zeros(3, dtype=">f4")),
                         "TypeError", "big-endian"),
}


def test_mismatched_calls_raise_on_every_rank():
    calls = list(MISMATCHES.values())
    out = md.launch(_on_every_rank, 3, args=(calls,), timeout=20)
    for r, (errors, after) in enumerate(out):
        assert after == [3.0] * 5  # still usable: no stray message was left behind
        for name, err in zip(MISMATCHES, errors):
            assert err is not None, f"{name}: rank {r} raised nothing"
            kind, text = err
            assert kind == "CollectiveMismatchError", (name, err)
            assert f"rank {r}: the ranks called a collective with different arguments" in text
            assert "rank 0:" in text or "ranks 0" in text, text


def test_mismatch_message_names_what_each_rank_passed():
    out = md.launch(_on_every_rank, 3, args=([MISMATCHES["length"]],))
    text = out[1][0][0][1]
    assert "rank 0: all_reduce(float32[11], op='sum', algorithm='auto')" in text
    assert "ranks 1, 2: all_reduce(float32[10], op='sum', algorithm='auto')" in text


@pytest.mark.parametrize("world_size", [1, 3])
def test_invalid_arguments_raise_the_same_clear_error_on_every_rank(world_size):
    calls = [call for call, _, _ in INVALID.values()]
    out = md.launch(_on_every_rank, world_size, args=(calls,), timeout=20)
    for errors, after in out:
        assert after == [float(sum(range(world_size)))] * 5
        for (name, (_, kind, text)), err in zip(INVALID.items(), errors):
            if name == "root out of range" and world_size > 7:
                continue
            assert err is not None and err[0] == kind and text in err[1], (name, err)
    assert all(o[0] == out[0][0] for o in out)  # the same words on every rank


def _only_rank_zero_calls(comm):
    if comm.rank == 0:
        md.all_reduce(comm, torch.zeros(3))


@pytest.mark.parametrize("backend", ["local", "torch"])
def test_a_rank_that_never_comes_is_an_error_not_a_hang(backend):
    with pytest.raises(md.WorkerError) as info:
        md.launch(_only_rank_zero_calls, 2, backend=backend, timeout=2)
    # blamed: rank 1, which returned without calling it, not rank 0 left waiting (issue 10)
    assert info.value.rank == 1 and "returned from its function" in str(info.value)
