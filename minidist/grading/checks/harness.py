"""Running a learner's function on several ranks, with failures turned into feedback."""

from __future__ import annotations

from ...errors import WorkerError
from ...launch import launch
from ..feedback import Mistake, describe_exception

# Seconds a blocking call in a check may wait: long enough for a loaded 2-core machine,
# short enough that a deadlock is reported quickly.
COMM_TIMEOUT = 10.0


def run_ranks(body, world_size: int, args: tuple, name: str, case: str) -> list:
    """``md.launch(body, world_size, args)``; a failing rank becomes a ``Mistake`` that says
    which function, which case (``case``, e.g. ``"world_size=3, n=7"``) and what happened."""
    try:
        return launch(body, world_size, args=args, timeout=COMM_TIMEOUT)
    except WorkerError as e:
        text = describe_exception(e, name)
        if e.exc_type == "NotImplementedError":  # the same for every case
            raise Mistake(text) from None
        raise Mistake(f"with {case}: {text}") from None


def pattern(rank: int, n: int, dtype, world_size: int):
    """Rank ``rank``'s test data: rank-specific, position-specific, exact in every dtype.

    Element i of rank r is 2^r + 2^p * i, so any sum over ranks stays an exact integer and
    its low bits say which ranks contributed (see ``contributors``).
    """
    import torch

    return (2 ** rank + (2 ** world_size) * torch.arange(n, dtype=torch.float64)).to(dtype)


def contributors(value: float, index: int, world_size: int) -> list[int] | None:
    """The ranks whose ``pattern`` values sum to ``value`` at ``index``, each counted once;
    None if no such set exists (a value counted twice, or from another position)."""
    v = round(float(value))
    if v != float(value):
        return None
    ranks = [r for r in range(world_size) if (v % 2 ** world_size) >> r & 1]
    expected = sum(2 ** r for r in ranks) + len(ranks) * 2 ** world_size * index
    return ranks if expected == v else None


def stats_of(comm) -> dict:
    """A rank's traffic as plain ints: totals and bytes/messages sent to each peer."""
    s = comm.stats
    return {"bytes_sent": s.bytes_sent, "messages_sent": s.messages_sent,
            "bytes_received": s.bytes_received,
            "sent_to": {p: ps.bytes_sent for p, ps in s.per_peer.items() if ps.messages_sent},
            "messages_to": {p: ps.messages_sent for p, ps in s.per_peer.items()
                            if ps.messages_sent}}

