"""A shared-memory name's guard: a ``sh`` that removes ``/dev/shm/<name>`` once every
process that could still use the name is gone, whatever signal ended them
(``shm_segment.py``'s module docstring says why the creator cannot do it itself).

``is_name_guard(pid)`` tells a killer of process trees (the grader's time limit,
``grading/engine/fresh.py``) which processes to spare: killed, a guard leaves the name.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class NameGuard:
    """The ``sh`` waits on a pipe on its stdin whose write end only the creator (and the
    ranks it forks) hold; when they are all gone the pipe closes and the name goes."""

    SCRIPT = 'read -r _; rm -f "/dev/shm/$1"'

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    @classmethod
    def command(cls, name: str) -> list[str]:
        """The guard's command line for ``name``: what ``is_name_guard`` recognises."""
        return ["/bin/sh", "-c", cls.SCRIPT, "md-guard", name.lstrip("/")]

    @classmethod
    def start(cls, name: str) -> NameGuard | None:
        if not os.path.isdir("/dev/shm") or not os.path.exists("/bin/sh"):
            return None  # no /dev/shm (macOS): nothing to guard this way
        try:
            proc = subprocess.Popen(cls.command(name), stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError:
            return None
        return cls(proc)

    def stop(self) -> None:
        """The creator removed the name itself: end the guard (it would remove no name)."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


def is_name_guard(pid: int) -> bool:
    """Whether ``pid`` is a name guard that ends by itself: the guard's exact command line,
    stdin an anonymous pipe read-only, stdout and stderr ``/dev/null``, no other file open.
    So a look-alike that holds a write end (or reads a file) is not spared."""
    proc = Path(f"/proc/{pid}")
    try:
        argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
        fds = {int(fd.name): os.readlink(fd) for fd in (proc / "fd").iterdir()}
        flags = (proc / "fdinfo" / "0").read_text().split("flags:")[1].split()[0]
    except (OSError, IndexError, ValueError):
        return False
    return (len(argv) == 5 and argv[4].startswith("md-") and argv == NameGuard.command(argv[4])
            and sorted(fds) == [0, 1, 2] and fds[0].startswith("pipe:")
            and fds[1] == fds[2] == os.devnull and int(flags, 8) & os.O_ACCMODE == os.O_RDONLY)
