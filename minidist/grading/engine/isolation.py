"""Running learner code in a child process: a time limit, and plain data back.

Learner code never runs in the process that judges it. :func:`run_in_child` forks; the child
runs a grader function (which may load and call the learner's code, or ``md.launch`` it on
ranks) and writes its result to a pipe as JSON, which the parent parses: no pickle, so
nothing the child sends can run code in the parent. A child still running at the deadline is
killed with everything it started (it leads a process group of its own).

Plain data: ``None``, bools, ints, floats, strings, lists, tuples, dicts, tensors (as dtype,
shape and values) and, for anything else, an :class:`Opaque` that keeps only its type name
and a short repr, for feedback.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import torch

from .fresh import become_subreaper, end_tree, reap, warm
from .fresh import context as fresh_context
from .fresh import start as start_fresh

MAX_DEPTH = 6
MAX_VALUES = 1_000_000  # a larger tensor comes back as its shape and dtype only


@dataclass(frozen=True)
class Opaque:
    """A value the learner returned that is not plain data: what it was, for feedback."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass
class RemoteError(Exception):
    """An exception raised in a child: its type name, message and traceback, and for a rank
    (``md.launch``'s ``WorkerError``) the rank, its exception type and its traceback."""

    type_name: str
    message: str
    traceback: str = ""
    rank: int | None = None
    exc_type: str | None = None
    remote_traceback: str = ""

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class ChildTimeout(Exception):
    """The child ran past its deadline and was killed."""


# -- plain data ------------------------------------------------------------------------------
def to_plain(x, depth: int = 0):
    """``x`` as JSON-ready data (see the module docstring); runs in the child."""
    if x is None or isinstance(x, (bool, str)):
        return bool(x) if isinstance(x, bool) else (None if x is None else str(x))
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, Opaque):
        return {"__object__": x.type_name, "repr": x.text}
    if depth > MAX_DEPTH:
        return _opaque(x)
    if isinstance(x, torch.Tensor):
        t = torch.Tensor.detach(x).cpu()
        if t.is_complex() or t.numel() > MAX_VALUES:
            return {"__object__": "Tensor", "repr": f"a tensor of shape {tuple(t.shape)} and "
                                                    f"dtype {t.dtype}"}
        return {"__tensor__": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "values": torch.Tensor.tolist(t.flatten())}
    converted = _numpy(x)
    if converted is not None:
        return to_plain(converted, depth + 1)
    if isinstance(x, (list, tuple)):
        return {"__seq__": "tuple" if isinstance(x, tuple) else "list",
                "items": [to_plain(v, depth + 1) for v in list(x)[:100_000]]}
    if isinstance(x, dict):
        return {"__dict__": [[to_plain(k, depth + 1), to_plain(v, depth + 1)]
                             for k, v in list(x.items())[:10_000]]}
    return _opaque(x)


def _numpy(x):
    np = _numpy_module()
    if np is None:
        return None
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy()) if x.dtype.kind in "biuf" else x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return None


def _numpy_module():
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch
        return None
    return numpy


def _opaque(x) -> dict:
    try:
        text = repr(x)
    except Exception:
        text = "<unprintable>"
    return {"__object__": type(x).__qualname__, "repr": text[:200]}


def from_plain(x):
    """The inverse of :func:`to_plain`; runs in the parent, on parsed JSON only."""
    if not isinstance(x, (dict, list)):
        return x
    if isinstance(x, list):
        return [from_plain(v) for v in x]
    if "__tensor__" in x:
        dtype = getattr(torch, str(x["__tensor__"]), None)
        if not isinstance(dtype, torch.dtype):
            return Opaque("Tensor", f"a tensor of dtype {x['__tensor__']}")
        return torch.tensor(x["values"], dtype=dtype).reshape([int(s) for s in x["shape"]])
    if "__seq__" in x:
        items = [from_plain(v) for v in x["items"]]
        return tuple(items) if x["__seq__"] == "tuple" else items
    if "__dict__" in x:
        return {_key(from_plain(k)): from_plain(v) for k, v in x["__dict__"]}
    if "__object__" in x:
        return Opaque(str(x["__object__"]), str(x.get("repr", "")))
    return {k: from_plain(v) for k, v in x.items()}


def sanitize(x):
    """``x`` reduced to what plain data keeps (tensors, builtins, ``Opaque``)."""
    return from_plain(json.loads(json.dumps(to_plain(x))))


def _key(k):
    return k if isinstance(k, (str, int, float, bool, type(None), tuple)) else repr(k)


def error_to_plain(e: BaseException) -> dict:
    """An exception raised in the child, as plain data (``RemoteError``'s fields)."""
    rank_error = hasattr(e, "remote_traceback") and isinstance(getattr(e, "message", None), str)
    return {"type_name": type(e).__name__, "message": (e.message if rank_error else str(e))[:4000],
            "traceback": traceback.format_exc()[-8000:],
            "rank": getattr(e, "rank", None) if rank_error else None,
            "exc_type": getattr(e, "exc_type", None),
            "remote_traceback": str(getattr(e, "remote_traceback", ""))[-8000:]}


# -- the child -------------------------------------------------------------------------------
def run_in_child(fn, args: tuple = (), limit: float = 60.0, quiet: bool = True,
                 fresh: bool = False):
    """``fn(*args)`` in a child process; its result as plain data (``fn`` must return what
    :func:`to_plain` produced). Raises :class:`RemoteError` for an exception in the child and
    :class:`ChildTimeout` past ``limit`` seconds. ``fresh``: a fresh process that holds only
    ``fn`` and ``args`` (``fresh.py``; both must pickle), else a fork of this one (the
    notebook's ``check``, whose learner functions live in the kernel)."""
    deadline = time.monotonic() + max(0.0, limit)
    if fresh:
        warm()  # a fork server killed by the last child is booted outside this clock
        deadline = time.monotonic() + max(0.0, limit)
        # the pipe's ends as Connections: the fork server passes their fds along
        reader, writer = fresh_context().Pipe(duplex=False)
        go_reader, go_writer = fresh_context().Pipe(duplex=False)
        try:
            proc = start_fresh(_fresh_child, (fn, args, writer, go_reader, quiet))
        except BaseException:
            go_writer.close()  # a child forked meanwhile reads no go, and leaves
            reader.close()
            raise
        finally:
            writer.close()
            go_reader.close()
        read_fd, pid = reader.fileno(), proc.pid
        os.write(go_writer.fileno(), b"g")  # its pid is known: now it may run learner code
        # go_writer stays open while the child runs: its end is the child's lifeline (a
        # grader killed outright must not leave a stuck answer running: _fresh_child)
    else:
        read_fd, write_fd = os.pipe()
        proc, reader, pid = None, None, os.fork()
        if pid == 0:  # pragma: no cover - the child; coverage does not follow forks
            os.close(read_fd)
            _child(fn, args, write_fd, quiet)
        os.close(write_fd)
    try:
        data = _read_until(read_fd, deadline)
    finally:
        if proc is not None:
            reader.close()
            reap(proc)
            go_writer.close()
        else:
            os.close(read_fd)
            _kill_group(pid)
    if data is None:
        raise ChildTimeout(f"still running after {limit:g} s")
    message = _parse(data)
    if "error" in message:
        fields = message["error"] if isinstance(message["error"], dict) else {}
        raise RemoteError(**{k: d if fields.get(k) is None else fields[k] for k, d in
                             (("type_name", "Error"), ("message", ""), ("traceback", ""),
                              ("rank", None), ("exc_type", None), ("remote_traceback", ""))})
    return from_plain(message.get("ok"))


def _fresh_child(fn, args, writer, go, quiet: bool) -> None:  # pragma: no cover - the child
    # the pipe's write end came as a Connection; only its fd is used (our own framing, no
    # pickle). It waits for the grader's go: until the fork server has told the grader its
    # pid, an answer that killed the server would leave the grader no pid to kill.
    if os.read(go.fileno(), 1) != b"g":
        os._exit(1)
    threading.Thread(target=_end_with_grader, args=(go.fileno(),), daemon=True).start()
    _child(fn, args, writer.fileno(), quiet)


def _end_with_grader(lifeline: int) -> None:  # pragma: no cover - the child
    """The grader holds the other end of ``lifeline`` until this child has ended; EOF
    before that means the grader died (killed outright, no time to end the tree): end
    this child and everything it started, instead of running on with no one to wait."""
    os.read(lifeline, 1)
    end_tree(os.getpid())  # every process it started (not itself: end_tree spares it)
    os._exit(1)


def _child(fn, args, write_fd: int, quiet: bool) -> None:  # pragma: no cover - the child
    code = 0
    try:
        os.setsid()  # a session of its own: killed as one, and Ctrl-C goes to the parent only
        become_subreaper()  # a double-forked grandchild stays ours to kill
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(1)  # forked after the parent's OpenMP pool: one thread only
        if quiet:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        try:
            payload = {"ok": fn(*args)}
        except BaseException as e:  # everything the learner's code may raise
            payload = {"error": error_to_plain(e)}
        try:
            data = json.dumps(payload).encode()
        except (TypeError, ValueError) as e:
            data = json.dumps({"error": {"type_name": "ResultError", "message": "the result "
                                         f"could not be sent back as plain data: {e}"}}).encode()
        view = memoryview(len(data).to_bytes(8, "little") + data)
        while view:
            view = view[os.write(write_fd, view):]
    except BaseException:
        code = 1
    finally:
        try:
            end_tree(os.getpid(), include_self=False)  # what it started ends with it
        finally:
            os._exit(code)


def _read_until(fd: int, deadline: float) -> bytes | None:
    """The child's message (8 bytes of length, then the JSON), b"" if the pipe closed
    first, None at the deadline. Read by length, not to the end of the pipe: a process the
    child started may hold the pipe open after the child is done."""
    data, want = b"", None
    while want is None or len(data) < want + 8:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            data += chunk
            if want is None and len(data) >= 8:
                want = int.from_bytes(data[:8], "little")
    return data[8:want + 8]


def _parse(data: bytes) -> dict:
    try:
        message = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        message = None
    if not isinstance(message, dict):
        return {"error": {"type_name": "ProcessError",
                          "message": "the test process ended without a result (did the code "
                                     "call os._exit or kill its own process?)"}}
    return message


def _kill_group(pid: int) -> None:
    """Kill the child, its session and its descendants (``fresh.end_tree``); reap it."""
    end_tree(pid)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
