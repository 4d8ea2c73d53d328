"""Exercise 09's sandbox rule (``sandbox.COMM_EFFICIENCY``), applied in a forked child as the
grader applies it: the library's hierarchical all_reduce and compression, and torch's
PowerSGD hook, raise ``NotAllowed``; the collectives the learner builds on still work, and
every byte they move is a message (no shared-memory path); the rule stands when a module it
names is missing."""

from __future__ import annotations

import sys

import pytest
import torch

import minidist as md
from minidist.grading.engine import sandbox
from minidist.grading.engine.isolation import run_in_child, to_plain


def _refused(fn) -> str:
    try:
        fn()
    except sandbox.NotAllowed as e:  # a swapped function's refusal too
        return str(e)
    except Exception as e:
        return f"raised {e!r}"
    return "ran"


def _rank(comm) -> dict:
    t = torch.arange(6, dtype=torch.float64) + comm.rank
    md.all_reduce(comm, t)  # auto: allowed, and on messages only
    hier = _refused(lambda: md.all_reduce(comm, t.clone(), algorithm="hierarchical"))
    hier_positional = _refused(lambda: md.all_reduce(comm, t.clone(), "sum", "hierarchical"))
    return {"sum": t.tolist(), "bytes": comm.stats.bytes_sent, "hier": hier,
            "hier_positional": hier_positional}


def _under_rule(hidden: tuple[str, ...]) -> dict:
    for name in hidden:  # as if the module were not written yet: importing it fails
        sys.modules[name] = None
    sandbox.forbid([sandbox.COMM_EFFICIENCY])
    from minidist import compression

    return to_plain({
        "ranks": md.launch(_rank, 2, timeout=20.0),
        "topk": _refused(lambda: compression.TopK(0.1)),
        "powersgd": _refused(lambda: compression.PowerSGD(rank=2)),
        "process_group": _refused(lambda: torch.distributed.init_process_group("gloo")),
    })


@pytest.mark.parametrize("hidden", [(), ("minidist.collectives.hierarchical",
                                         "minidist.compression.topk")])
def test_rule_refuses_the_library_and_keeps_the_building_blocks(hidden):
    out = run_in_child(_under_rule, (hidden,), limit=60.0)
    for rank in out["ranks"]:
        assert rank["sum"] == [2.0 * i + 1.0 for i in range(6)]
        assert rank["bytes"] > 0  # messages, not the shared-memory path
        for key in ("hier", "hier_positional"):
            assert 'algorithm="hierarchical") is not allowed in this exercise' in rank[key]
    assert out["process_group"] != "ran"
    if not hidden:  # TopK's module there: refused; PowerSGD always is
        assert sandbox.NOT_ALLOWED_TEXT in out["topk"], out["topk"]
    assert sandbox.NOT_ALLOWED_TEXT in out["powersgd"], out["powersgd"]
