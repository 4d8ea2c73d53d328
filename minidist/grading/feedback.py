"""Feedback that names the mistake: which rank, which values, which call, which line.

A check raises :class:`Mistake` with a sentence a learner can act on. Exceptions raised by
the learner's own code (a stub's ``NotImplementedError``, a deadlock's ``CommTimeout``, an
``IndexError`` on rank 2) are turned into such sentences by :func:`describe_exception`.
"""

from __future__ import annotations

import re

import torch

from ..errors import CommTimeout, WorkerError

_LIBRARY_PATH = re.compile(r"/(minidist|torch|multiprocess|dill|site-packages|lib/python[\d.]+)/"
                           r"|<frozen ")


class Mistake(AssertionError):
    """A check found a mistake in the learner's code; the message says what and where."""


def describe_exception(exc: BaseException, name: str) -> str:
    """One paragraph about an exception raised while running the learner's ``name``."""
    if isinstance(exc, Mistake):
        return str(exc)
    if isinstance(exc, WorkerError):
        return _describe_worker_error(exc, name)
    if isinstance(exc, NotImplementedError):
        return _not_written(name)
    if isinstance(exc, CommTimeout):
        return f"deadlock in {name}: {exc}"
    return f"{name} raised {type(exc).__name__}: {exc}"


def _not_written(name: str) -> str:
    return (f"{name} is not written yet: replace `raise NotImplementedError(...)` with your "
            "code")


def _describe_worker_error(exc: WorkerError, name: str) -> str:
    where = learner_frame(exc.remote_traceback)
    at = f" at `{where[1]}` (line {where[0]} of your cell)" if where else ""
    if exc.exc_type == "NotImplementedError":
        return _not_written(name)
    if isinstance(exc, CommTimeout) or exc.exc_type == "CommTimeout":
        detail = exc.message.split(": ", 1)[-1]
        return f"deadlock in {name}{at}: {detail}"
    if exc.exc_type is None:
        return f"{name}: rank {exc.rank} {exc.message.split(': ', 1)[-1]}{at}"
    return f"{name} failed on rank {exc.rank}{at}: {exc.message}"


def learner_frame(traceback_text: str) -> tuple[int, str] | None:
    """(line, code) of the innermost traceback frame in the learner's code, if any.

    Notebook cells compile to files like ``/tmp/ipykernel_123/456.py``; frames inside
    minidist, torch or the standard library are skipped.
    """
    found = None
    lines = traceback_text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', line)
        if m and not _LIBRARY_PATH.search(m.group(1)):
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found = (int(m.group(2)), code)
    return found


def values(t, limit: int = 8) -> str:
    """A short text rendering of a tensor's values: ``[1, 2, 3, ... (100 values)]``."""
    flat = torch.as_tensor(t).flatten().tolist()
    shown = ", ".join(_num(v) for v in flat[:limit])
    return f"[{shown}, ... ({len(flat)} values)]" if len(flat) > limit else f"[{shown}]"


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def compare(got, expected, who: str) -> str | None:
    """None if ``got`` equals ``expected`` (shape, dtype, values); else what differs."""
    if not isinstance(got, torch.Tensor):
        return f"{who} returned a {type(got).__name__}, expected a tensor"
    if got.shape != expected.shape:
        return (f"{who} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}: "
                f"got {values(got)}")
    if got.dtype != expected.dtype:
        return f"{who} has dtype {got.dtype}, expected {expected.dtype}"
    close = torch.isclose(got.double(), expected.double(), rtol=1e-5, atol=1e-6)
    if bool(close.all()):
        return None
    wrong = (~close).nonzero().flatten().tolist()
    shown = ", ".join(f"[{i}] = {_num(got.flatten()[i].item())} (expected "
                      f"{_num(expected.flatten()[i].item())})" for i in wrong[:3])
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    return f"{who}: {len(wrong)} of {got.numel()} values wrong: {shown}{more}"


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
