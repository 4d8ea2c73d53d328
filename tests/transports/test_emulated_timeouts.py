"""A message the emulated link makes slower than the timeout says so (``SlowLinkTimeout``:
the link, the size, the modelled time, what to raise), rather than timing out as if the
ranks were deadlocked. Each test waits at most half a second on purpose."""

from __future__ import annotations

import math

import pytest
import torch

import minidist as md

CRAWL = md.Link(alpha=1e-3, bandwidth=1e-300, name="crawl")  # 16 bytes: 1.6e301 s


def _send_catching(comm):
    """Rank 0 sends 16 bytes over the crawling link; rank 1 expects nothing."""
    if comm.rank == 1:
        return None
    try:
        comm.send(torch.ones(4), 1)
    except md.CommTimeout as e:
        return type(e).__name__, str(e)
    return "sent", ""


def test_a_message_slower_than_the_timeout_fails_at_its_send_and_says_why():
    net = md.Network.uniform(CRAWL)
    kind, text = md.launch(_send_catching, 2, network=net, timeout=0.5)[0]
    assert kind == "SlowLinkTimeout", text
    for part in ("rank 0: send with rank 1", "within the timeout of 0.5 s", "16 bytes",
                 "takes 1.6e+301 s", "alpha=1 ms", "bandwidth=1e-300 B/s", "'crawl'",
                 "not a deadlock", "raise the timeout", "bandwidth."):
        assert part in text, (part, text)
    assert "deadlock?" not in text, text


def _send_recv(comm):
    if comm.rank == 0:
        comm.send(torch.ones(4), 1)
    else:
        comm.recv(torch.empty(4), 0)


def test_the_launch_names_the_sender_and_the_link():
    with pytest.raises(md.WorkerError, match=r"rank 0 failed.*16 bytes takes 1\.6e\+301 s"):
        md.launch(_send_recv, 2, network=md.Network.uniform(CRAWL), timeout=0.5)


def test_a_message_that_never_arrives_fails_even_without_a_timeout():
    """16 bytes at 5e-324 B/s take inf seconds: no timeout is long enough."""
    net = md.Network.uniform(md.Link(alpha=0.0, bandwidth=5e-324))
    with pytest.raises(md.WorkerError, match=r"rank 0 failed.*takes inf s"):
        md.launch(_send_recv, 2, network=net, timeout=math.inf)


def _queued(comm):
    """Rank 0 sends 3 s of bytes, then 4 bytes on another tag; rank 1 waits 0.5 s for the
    small one, which the model queues behind the big one on rank 0's egress port."""
    comm.barrier()  # 0 bytes, no latency: both ranks start together
    if comm.rank == 0:
        comm.isend(torch.ones(750), 1, tag=1)  # 3000 bytes at 1 kB/s
        comm.isend(torch.ones(1), 1, tag=2)
        return None
    try:
        comm.irecv(torch.empty(1), 0, tag=2).wait(timeout=0.5)
    except md.CommTimeout as e:
        return type(e).__name__, str(e)
    return "received", ""


def test_a_wait_queued_behind_earlier_messages_says_so():
    net = md.Network.uniform(md.Link(alpha=0.0, bandwidth=1e3))
    kind, text = md.launch(_queued, 2, network=net, timeout=10.0)[1]
    assert kind == "SlowLinkTimeout", text
    for part in ("rank 1: irecv with rank 0 (tag 2)", "within the timeout of 0.5 s",
                 "after the wait ran out", "4 bytes takes 0.004 s",
                 "behind earlier messages on the same ports", "not a deadlock"):
        assert part in text, (part, text)


@pytest.mark.parametrize("bandwidth", [0, 0.0, -1, -math.inf, math.nan])
def test_a_bandwidth_that_is_not_positive_is_refused_with_the_way_out(bandwidth):
    with pytest.raises(ValueError, match=r"bandwidth .* must be > 0, got .*; for a link with "
                                         r"latency only, pass bandwidth=math.inf"):
        md.Link(alpha=1e-6, bandwidth=bandwidth)
    assert md.Link(alpha=1e-6, bandwidth=math.inf).time(1 << 30) == 1e-6  # latency only
