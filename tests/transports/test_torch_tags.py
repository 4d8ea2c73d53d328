"""The torch backend's gloo tags (issue 10, item 6): user tags in USER_TAGS never share a
gloo tag on one communicator, user, control and collective traffic never do, and a tag
outside the range is refused with the range in the message (0 and 2**30 collided)."""

from __future__ import annotations

import pytest
import torch

import minidist as md
from minidist.comm.contexts import WORLD_CTX, Ch
from minidist.transports.torch_dist import USER_TAGS, _wire_tags


def test_wire_tags_are_distinct_within_a_communicator():
    """Every channel of the world communicator (``comm/contexts.py``), every tag."""
    lo, hi = USER_TAGS
    tags = list(range(-3000, 3000)) + [lo, lo + 1, hi - 1, hi - 2, 1 << 20, -(1 << 20)]
    wires = {_wire_tags(WORLD_CTX + ch, t)[i] for ch in Ch for t in tags for i in (0, 1)}
    assert len(wires) == len(Ch) * len(set(tags)) * 2
    assert all(0 <= w < 2**31 for w in wires)


def _tags(comm):
    peer = 1 - comm.rank
    out = []
    try:
        comm.send(torch.zeros(1), peer, tag=2**30)
    except ValueError as e:
        out.append(str(e))
    tags = [0, USER_TAGS[1] - 1, USER_TAGS[0], -5]
    if comm.rank == 0:
        for t in tags:
            comm.send(torch.tensor([t], dtype=torch.int64), 1, tag=t)
    else:
        bufs = {t: torch.empty(1, dtype=torch.int64) for t in tags}
        reqs = [comm.irecv(bufs[t], 0, tag=t) for t in reversed(tags)]
        for r in reqs:
            r.wait()
        out.append([bufs[t].item() for t in tags])
    x = torch.ones(2)
    md.all_reduce(comm, x)
    out.append(x.tolist())
    return out


def test_tags_on_the_torch_backend():
    out = md.launch(_tags, 2, backend="torch", timeout=20)
    assert "out of range for the torch backend" in out[0][0] and str(USER_TAGS[0]) in out[0][0]
    assert out[1][1] == [0, USER_TAGS[1] - 1, USER_TAGS[0], -5]
    assert out[0][-1] == out[1][-1] == [2.0, 2.0]


@pytest.mark.parametrize("tag", [2**30, -(2**30), USER_TAGS[1]])
def test_out_of_range_tag_is_refused(tag):
    def fn(comm):
        try:
            comm.irecv(torch.empty(1), 1 - comm.rank, tag=tag)
        except ValueError as e:
            return str(e)
        return None

    assert "use tags in" in md.launch(fn, 2, backend="torch", timeout=10)[0]
