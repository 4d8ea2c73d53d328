"""What runs on each rank of a test, and the test data every check shares.

:func:`rank_entry` is the function ``md.launch`` runs on each rank (``learner.run_ranks``):
it hardens the communicator (``sandbox.guard``), then runs the test's cases one after the
other, all ranks starting each case together (a barrier of the grader's own, on tags no
learner's barrier uses). A rank whose call waits past the communicator's timeout stops and
reports where it waits, so a deadlock is shown as every rank's blocked call, not just the
first to time out. Each case's result comes back as plain data, with the rank's traffic as
the transport saw it.
"""

from __future__ import annotations

import time
import traceback

import torch

from ...errors import CommTimeout
from ..feedback import learner_frame
from ..isolation import to_plain
from ..sandbox import guard

IN_CODE, RETURNED, DONE, BLOCKED = 1, 2, 3, 4  # a rank's phase, in ``progress``
_BARRIER_TAG = -(1 << 41)
_EMPTY = torch.empty(0, dtype=torch.uint8)


def rank_entry(comm, case_fn, namespace, rules, cases, progress) -> dict:
    """Run ``case_fn(comm, namespace, *case)`` for each case; see the module docstring."""
    transport, out = guard(comm, rules), []
    for i, case in enumerate(cases):
        _mark(progress, comm.rank, i, RETURNED)
        try:
            grader_barrier(comm)
        except CommTimeout:
            return {"results": out, "blocked": {"case": i, "returned": True}}
        comm.stats.reset()
        transport.reset()
        comm.timeline.events.clear()
        _mark(progress, comm.rank, i, IN_CODE)
        try:
            value = case_fn(comm, namespace, *case)
        except CommTimeout as e:
            _mark(progress, comm.rank, i, BLOCKED)
            return {"results": out, "blocked": _blocked(e, i)}
        out.append({"value": to_plain(value), "traffic": to_plain(_traffic(comm, transport))})
    _mark(progress, comm.rank, len(cases), RETURNED)
    try:
        grader_barrier(comm)
    except CommTimeout:
        return {"results": out, "blocked": {"case": len(cases), "returned": True}}
    _mark(progress, comm.rank, len(cases), DONE)
    return {"results": out}


def _mark(progress, rank: int, case: int, phase: int) -> None:
    progress[2 * rank], progress[2 * rank + 1] = case, phase


def grader_barrier(comm) -> None:
    """A dissemination barrier on the control context, on tags of the grader's own."""
    p, k, control = comm.world_size, 1, comm.control
    while k < p:
        r = control.irecv(_EMPTY, (comm.rank - k) % p, _BARRIER_TAG - k)
        control.isend(_EMPTY, (comm.rank + k) % p, _BARRIER_TAG - k).wait(op="barrier")
        r.wait(op="barrier")
        k *= 2


def _blocked(e: CommTimeout, case: int) -> dict:
    where = learner_frame(traceback.format_exc())
    return to_plain({"case": case, "returned": False, "op": str(getattr(e, "op", "wait")),
                     "peer": getattr(e, "peer", None), "tag": getattr(e, "tag", None),
                     "detail": str(getattr(e, "detail", "")), "line": where})


def _traffic(comm, transport) -> dict:
    """The rank's messages on the user context, as its transport saw them."""
    stats = comm.stats
    counted = {p: s.bytes_sent for p, s in stats.per_peer.items() if s.messages_sent}
    messages = {p: s.messages_sent for p, s in stats.per_peer.items() if s.messages_sent}
    sendrecvs = sum(1 for e in comm.timeline.events if e[0] == "sendrecv")
    return {"sent_to": dict(transport.sent), "messages_to": dict(transport.messages),
            "bytes_sent": sum(transport.sent.values()), "hidden": transport.hidden,
            "stats_ok": counted == transport.sent and messages == transport.messages,
            "sendrecv": sendrecvs, "eager_ok": comm.eager_limit == 0}


# -- test data ---------------------------------------------------------------------------------
def pattern(rank: int, n, dtype, world_size: int):
    """Rank ``rank``'s test data: rank-specific, position-specific, exact in every dtype.

    Element i of rank r is 2^r + 2^p * i, so any sum over ranks stays an exact integer and
    its low bits say which ranks contributed (see ``contributors``). ``n`` is a length or a
    shape (the values run along the flattened tensor).
    """
    shape = (n,) if isinstance(n, int) else tuple(n)
    numel = 1
    for s in shape:
        numel *= s
    flat = 2 ** rank + (2 ** world_size) * torch.arange(numel, dtype=torch.float64)
    return flat.to(dtype).reshape(shape)


def contributors(value: float, index: int, world_size: int) -> list[int] | None:
    """The ranks whose ``pattern`` values sum to ``value`` at ``index``, each counted once;
    None if no such set exists (a value counted twice, or from another position)."""
    v = round(float(value))
    if v != float(value):
        return None
    ranks = [r for r in range(world_size) if (v % 2 ** world_size) >> r & 1]
    expected = sum(2 ** r for r in ranks) + len(ranks) * 2 ** world_size * index
    return ranks if expected == v else None


def traffic_text(traffic: dict) -> str:
    """``3 message(s), 120 bytes to rank 1, ...`` or ``nothing``."""
    if not traffic["messages_to"]:
        return "nothing"
    return ", ".join(f"{m} message(s), {traffic['sent_to'].get(p, 0)} bytes to rank {p}"
                     for p, m in sorted(traffic["messages_to"].items()))


def sleep_then(seconds: float, fn, *args):
    """``fn(*args)`` after ``seconds``: a rank that starts late."""
    time.sleep(seconds)
    return fn(*args)
