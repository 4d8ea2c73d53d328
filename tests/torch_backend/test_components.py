"""torch's own components over minidist equal the same over gloo and in one process.

DDP, ZeroRedundancyOptimizer, FSDP2 (``fully_shard``), ``Schedule1F1B``, DTensor tensor
parallelism and a 2-D ``init_device_mesh`` (tp within a row, dp across rows) train three
steps in float64 (``torch_programs.py``); every parameter, gathered whole, matches gloo's run
and the single-process run within 1e-12, at 2 and 4 ranks, and with a learner's ring
plugged in as the backend's all-reduce. The call counts show torch really went through
the backend (and through the ring).
"""

from __future__ import annotations

import pytest
import torch
from torch_programs import PROGRAMS, run_rank

import minidist as md

TOL = 1e-12


def _whole(results) -> dict:
    out = {}
    for r in results:
        out.update(r["params"])
    return out


def _oracle(program: str, p: int) -> dict:
    return PROGRAMS[program](0, 1, **({"stages": p} if program == "1f1b" else {}))


def _assert_close(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), what
    for k in want:
        err = (got[k] - want[k]).abs().max().item()
        assert err <= TOL, f"{what}: {k} off by {err:.3g}"


# what each program must have asked the backend for (by torch.distributed's names)
EXPECTED_CALLS = {"ddp": {"all_reduce", "broadcast"}, "zero": {"all_reduce", "broadcast"},
                  "fsdp2": {"all_gather_into_tensor", "reduce_scatter_tensor"},
                  "tp": {"all_reduce", "all_gather_into_tensor_coalesced"},
                  "2d": {"new_group"}, "1f1b": {"send", "recv"}}


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_equals_gloo_and_one_process(program, p):
    want = _oracle(program, p)
    ours = md.launch(run_rank, p, args=(program, "minidist"), timeout=120)
    gloo = md.launch(run_rank, p, args=(program, "gloo"), backend="torch", timeout=120)
    _assert_close(_whole(ours), want, f"minidist vs one process ({program}, {p} ranks)")
    _assert_close(_whole(gloo), want, f"gloo vs one process ({program}, {p} ranks)")
    _assert_close(_whole(ours), _whole(gloo), f"minidist vs gloo ({program}, {p} ranks)")
    assert EXPECTED_CALLS[program] <= ours[0]["calls"].keys(), ours[0]["calls"]


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("program", ["ddp", "2d"])
def test_learner_ring_plugged_in(program, p):
    """The all-reduces go through the learner's ring (it counts them), and training still
    equals one process."""
    want = _oracle(program, p)
    ours = md.launch(run_rank, p, args=(program, "minidist", True), timeout=120)
    _assert_close(_whole(ours), want, f"learner ring vs one process ({program}, {p} ranks)")
    assert all(r["ring_calls"] > 0 for r in ours), [r["ring_calls"] for r in ours]
    if program == "ddp":  # DDP's buckets: one ring call per all_reduce the backend saw
        assert ours[0]["ring_calls"] == ours[0]["calls"]["all_reduce"]


def test_ddp_replicas_bitwise():
    """The backend's result is computed once per element and copied: every DDP replica
    holds the same bits."""
    ours = md.launch(run_rank, 4, args=("ddp", "minidist"), timeout=120)
    for r in ours[1:]:
        for k, v in r["params"].items():
            assert torch.equal(v, ours[0]["params"][k]), k
