"""Feedback that names the mistake: which rank, which values, which call, which line.

A check raises :class:`Mistake` with a sentence a learner can act on. Exceptions raised by
the learner's code in a child process (a stub's ``NotImplementedError``, an ``IndexError`` on
rank 2, a call to what the exercise builds) arrive as plain data and become such sentences in
:func:`describe_remote`; a deadlock becomes every rank's blocked call (:func:`deadlock_text`).
"""

from __future__ import annotations

import re

import torch

from .sandbox import NOT_ALLOWED_TEXT as NOT_ALLOWED

_LIBRARY_PATH = re.compile(r"/(minidist|torch|multiprocess|dill|site-packages|lib/python[\d.]+)/"
                           r"|<frozen ")


class Mistake(AssertionError):
    """A check found a mistake in the learner's code; the message says what and where."""


def describe_remote(e, name: str, case: str = "") -> str:
    """One paragraph about an exception raised in a child (``isolation.RemoteError``) while
    running the learner's ``name``, in the case described by ``case``."""
    kind = e.exc_type or e.type_name
    if kind == "NotImplementedError":
        return _not_written(name)
    text = e.message.split(": ", 1)[-1] if e.exc_type and e.message.startswith(kind) \
        else e.message
    where = learner_frame(e.remote_traceback or e.traceback)
    at = f" at `{where[1]}` ({_line_of(where)})" if where else ""
    if kind == "ProgramError":
        return f"the notebook's code for {name} could not run{at}: {text}"
    if NOT_ALLOWED in text:
        head = (f"{name} calls what this exercise asks you to write yourself{at}, which earns "
                "nothing")
        return f"with {case}: {head}: {text}" if case else f"{head}: {text}"
    if e.rank is not None:
        body = (f"rank {e.rank} {text}" if e.exc_type is None
                else f"{name} failed on rank {e.rank}{at}: {kind}: {text}")
    else:
        body = f"{name} raised {kind}{at}: {text}"
    return f"with {case}: {body}" if case else body


def _not_written(name: str) -> str:
    return (f"{name} is not written yet: replace `raise NotImplementedError(...)` with your "
            "code")


_GRADER_CODE = ("<not allowed>", "<observed>")  # code the sandbox compiles, never the learner's


def learner_frame(traceback_text: str) -> tuple[int, str, int | None] | None:
    """(line, code, cell) of the innermost traceback frame in the learner's code, if any.

    The grader compiles each cell as ``<cell N>``; in a kernel, cells compile to files like
    ``/tmp/ipykernel_123/456.py`` (cell None). Frames inside minidist, torch or the standard
    library are skipped.
    """
    found = None
    lines = traceback_text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', line)
        if m and not _LIBRARY_PATH.search(m.group(1)) and m.group(1) not in _GRADER_CODE:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            cell = re.fullmatch(r"<cell (\d+)>", m.group(1))
            code = "" if code.startswith("File ") else code
            found = (int(m.group(2)), code, int(cell.group(1)) if cell else None)
    return found


def _line_of(where) -> str:
    line, _, cell = where
    return f"line {line} of cell {cell}" if cell else f"line {line} of your cell"


def values(t, limit: int = 8) -> str:
    """A short text rendering of a tensor's values: ``[1, 2, 3, ... (100 values)]``."""
    flat = torch.as_tensor(t).flatten().tolist()
    shown = ", ".join(_num(v) for v in flat[:limit])
    return f"[{shown}, ... ({len(flat)} values)]" if len(flat) > limit else f"[{shown}]"


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def as_tensor(got, like: torch.Tensor):
    """``got`` as a tensor like ``like`` if it holds numbers (a list, a tuple, a number, a
    tensor of another dtype: the same answer in another container); else ``got``."""
    if isinstance(got, torch.Tensor) or got is None or isinstance(got, (str, dict)):
        return got
    try:
        return torch.as_tensor(got, dtype=like.dtype)
    except (TypeError, ValueError, RuntimeError):
        return got


def compare(got, expected, who: str) -> str | None:
    """None if ``got`` equals ``expected`` (shape, values; a list or tuple of the right
    numbers counts as the tensor); else what differs."""
    if isinstance(got, torch.Tensor) and got.dtype != expected.dtype:
        return f"{who} has dtype {got.dtype}, expected {expected.dtype}"
    got = as_tensor(got, expected)
    if not isinstance(got, torch.Tensor):
        return f"{who} returned {_a(got)}, expected a tensor"
    if got.shape != expected.shape:
        return (f"{who} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}: "
                f"got {values(got)}")
    close = torch.isclose(got.double(), expected.double(), rtol=1e-5, atol=1e-6)
    if bool(close.all()):
        return None
    wrong = (~close).flatten().nonzero().flatten().tolist()
    shown = ", ".join(f"[{i}] = {_num(got.flatten()[i].item())} (expected "
                      f"{_num(expected.flatten()[i].item())})" for i in wrong[:3])
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    return f"{who}: {len(wrong)} of {got.numel()} values wrong: {shown}{more}"


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _a(value) -> str:
    name = getattr(value, "type_name", None) or type(value).__name__
    return "None" if value is None else f"a {name}"


# -- deadlocks and hangs ---------------------------------------------------------------------
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
    at = f"`{where[1]}` ({_line_of(where)})" if where else f"{op}"
    return f"waits {short}{ahead}", f"waits in {at}: {what}{ahead}"


def stuck_text(name: str, limit: float, progress, world_size: int, labels: list[str]) -> str:
    """A test stopped at its time limit: which ranks were still running the learner's code."""
    from .checks.harness import BLOCKED, IN_CODE, RETURNED

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
