"""What runs on each rank of a test, and what the grader says when a run does not finish.

:func:`rank_entry` is the function ``md.launch`` runs on each rank (``learner.run_ranks``):
it hardens the communicator (``sandbox.guard``), then runs the test's cases one after the
other, all ranks starting each case together (a barrier of the grader's own, on tags no
learner's barrier uses). A rank whose call waits past the communicator's timeout stops and
reports where it waits, so a deadlock is shown as every rank's blocked call, not just the
first to time out. Each case's result comes back as plain data, with the rank's traffic as
the transport saw it. A run that stops short reads as every rank's state:
:func:`deadlock_text` (the ranks waited for each other) and :func:`stuck_text` (the test's
time ran out while a rank still ran the learner's code).
"""

from __future__ import annotations

import traceback

import torch

from ...errors import CommTimeout
from .feedback import learner_frame, line_of
from .isolation import to_plain
from .sandbox import guard

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


# -- a run that did not finish -----------------------------------------------------------------
_EAGER_HINT = (
    "A send larger than comm.eager_limit bytes (0 in the grader, as for large messages on a "
    "real cluster) returns only once its receiver has received it: if every rank sends "
    "first, no rank receives. Post the receive first (comm.irecv), or let some ranks receive "
    "first.")


def deadlock_text(name: str, blocked: dict, ranks: list, labels: list[str]) -> str:
    """Every rank's state when the ranks stopped waiting for each other."""
    stuck = [s["case"] for s in blocked.values() if not s["returned"]]
    case = min(stuck) if stuck else min(s["case"] for s in blocked.values())
    label = labels[min(case, len(labels) - 1)]
    states = [_rank_state(r, blocked.get(r), case, labels, name) for r in range(len(ranks))]
    first = next((s["line"] for s in blocked.values() if not s["returned"] and s["line"]),
                 None)
    at = f" at `{first[1]}`" if first and first[1] else ""
    short = "; ".join(f"rank {r} {text}" for r, (text, _) in enumerate(states))
    lines = [f"deadlock in {name}{at} ({label}): {short}"]
    lines += [f"  rank {r}: {detail}" for r, (_, detail) in enumerate(states) if detail]
    if any(s.get("op") == "send" and "eager limit" in (s.get("detail") or "")
           for s in blocked.values()):
        lines.append(_EAGER_HINT)
    return "\n".join(lines)


def _rank_state(rank, state, case, labels, name) -> tuple[str, str]:
    """(short, detailed) text for one rank."""
    if state is None:
        return "finished", ""
    ahead = f" (already in the next case, {labels[state['case']]})" \
        if state["case"] > case and state["case"] < len(labels) else ""
    if state["returned"]:
        return f"returned from {name} and waits for the others", ""
    op, peer, tag = state.get("op") or "wait", state.get("peer"), state.get("tag")
    who = "any rank" if peer is None else f"rank {peer}"
    tag_text = "" if tag is None else f" (tag {tag})"
    if "send" in op and "recv" not in op:
        short, what = f"in {op} to {who}", f"its message to {who}{tag_text} is never received"
    elif "barrier" in op:
        short, what = "in comm.barrier()", "not every rank calls comm.barrier()"
    else:
        short, what = f"in {op} from {who}", f"no message from {who}{tag_text} comes"
    where = state.get("line")
    at = f"`{where[1]}` ({line_of(where)})" if where else f"{op}"
    return f"waits {short}{ahead}", f"waits in {at}: {what}{ahead}"


def stuck_text(name: str, limit: float, progress, world_size: int, labels: list[str]) -> str:
    """A test stopped at its time limit: which ranks were still running the learner's code."""
    cases = [progress[2 * r] for r in range(world_size)]
    phases = [progress[2 * r + 1] for r in range(world_size)]
    running = [r for r in range(world_size) if phases[r] == IN_CODE]
    head = f"{name} did not finish within the test's {limit:g} s"
    if not any(phases):
        return f"{head}: the notebook's code for it did not finish loading (a loop at the top " \
               "level of a cell?)"
    case = min(cases[r] for r in running) if running else min(cases)
    label = labels[min(case, len(labels) - 1)]
    parts = [f"rank {r} was still running it" for r in running]
    parts += [f"rank {r} waited for a message" for r in range(world_size) if phases[r] == BLOCKED]
    parts += [f"rank {r} had returned" for r in range(world_size) if phases[r] == RETURNED]
    return f"with {label}: {head}: {'; '.join(parts)}. Is there an infinite loop?"
