"""``engine.calls``: the one recorder of md collective calls that exercises 05-10 count
exactly. It patches the functions of the process it runs in, so it runs on launched ranks
here, never in the test process."""

from __future__ import annotations

import torch

import minidist as md
from minidist.collectives import api
from minidist.grading.engine.calls import describe, numel, record_collectives


def test_describe_reads_every_argument_by_its_name():
    comm = object()
    by_position = describe("reduce", api.reduce, (comm, torch.zeros(3), 1, "max"), {})
    assert (by_position.numel, by_position.dst, by_position.op) == (3, 1, "max")
    assert by_position.comm is comm
    by_keyword = describe("reduce", api.reduce, (), {"comm": comm, "t": torch.zeros(2),
                                                     "dst": 2})
    assert (by_keyword.numel, by_keyword.dst, by_keyword.op) == (2, 2, "sum")
    coalesced = describe("all_reduce_coalesced", api.all_reduce_coalesced,
                         (comm, [torch.zeros(2), torch.zeros(5)]), {"op": "avg"})
    assert (coalesced.numel, coalesced.op, coalesced.dst) == (7, "avg", None)
    unbound = describe("all_gather", api.all_gather, (comm, torch.zeros(4), 1, 2), {})
    assert unbound.numel == 4  # its own TypeError follows when it runs
    assert numel("not a tensor") == -1


def _recorded(comm):
    from minidist.collectives import all_reduce as imported_under_another_name

    calls = []
    record_collectives(lambda c: calls.append((c.name, c.numel, c.op, c.comm is comm)))
    t = torch.ones(5)
    md.all_reduce(comm, t, op="max")
    imported_under_another_name(comm, t)
    md.all_gather(comm, torch.ones(2))
    shard = md.reduce_scatter(comm, torch.ones(4 * comm.world_size), op="avg")
    record_collectives(lambda c: calls.append(("replaced", c.name)), names=("all_reduce",))
    md.all_reduce(comm, t)
    return calls, float(t[0]), float(shard[0])


def test_every_call_is_recorded_however_imported_and_still_runs():
    for calls, value, shard in md.launch(_recorded, 2):
        assert calls == [("all_reduce", 5, "max", True), ("all_reduce", 5, "sum", True),
                         ("all_gather", 2, "sum", True), ("reduce_scatter", 8, "avg", True),
                         ("replaced", "all_reduce")]
        assert (value, shard) == (4.0, 1.0)  # max(1, 1) = 1, summed twice over 2 ranks
