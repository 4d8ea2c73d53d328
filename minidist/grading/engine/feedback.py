"""Feedback that names the mistake: which rank, which values, which call, which line.

A check raises :class:`Mistake` with a sentence a learner can act on. Exceptions raised by
the learner's code in a child process (a stub's ``NotImplementedError``, an ``IndexError`` on
rank 2, a call to what the exercise builds) arrive as plain data and become such sentences in
:func:`describe_remote`. The phrases every exercise's feedback shares (a tensor's values, a
list of ranks, a rank's messages) are here too; what a run that did not finish says is in
``harness.py``, next to the code that records it.
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
    at = f" at `{where[1]}` ({line_of(where)})" if where else ""
    if kind == "ProgramError":
        return f"the notebook's code for {name} could not run{at}: {text}"
    if NOT_ALLOWED in text:
        head = (f"{name} calls what this exercise asks you to write yourself{at}, which earns "
                "nothing")
        return with_case(case, f"{head}: {text}")
    if e.rank is not None:
        body = (f"rank {e.rank} {text}" if e.exc_type is None
                else f"{name} failed on rank {e.rank}{at}: {kind}: {text}")
    else:
        body = f"{name} raised {kind}{at}: {text}"
    return with_case(case, body)


def with_case(case: str, text: str) -> str:
    """``with <case>: <text>``, or the text alone when there is no case to name."""
    return f"with {case}: {text}" if case else text


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


def line_of(where) -> str:
    """``line 3 of cell 6`` for a frame :func:`learner_frame` found."""
    line, _, cell = where
    return f"line {line} of cell {cell}" if cell else f"line {line} of your cell"


# -- phrases ---------------------------------------------------------------------------------
def values(t, limit: int = 8) -> str:
    """A short text rendering of a tensor's values: ``[1, 2, 3, ... (100 values)]``."""
    flat = torch.as_tensor(t).flatten().tolist()
    shown = ", ".join(num(v) for v in flat[:limit])
    return f"[{shown}, ... ({len(flat)} values)]" if len(flat) > limit else f"[{shown}]"


def num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def a_value(value) -> str:
    """``a list``, ``a Tensor``, ``None``: what a learner's function returned, in a word."""
    name = getattr(value, "type_name", None) or type(value).__name__
    return "None" if value is None else f"a {name}"


def ranks_text(ranks: list[int]) -> str:
    """"rank 3", "ranks 0 and 4", "ranks 0, 2 and 4"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def traffic_text(traffic: dict) -> str:
    """``3 message(s), 120 bytes to rank 1, ...`` or ``nothing``: a rank's messages in a test
    case, as ``harness`` counted them."""
    if not traffic["messages_to"]:
        return "nothing"
    return ", ".join(f"{m} message(s), {traffic['sent_to'].get(p, 0)} bytes to rank {p}"
                     for p, m in sorted(traffic["messages_to"].items()))

