"""``CommitStore``: the commit files in ``commit_dir``, written atomically, read safely.

Files: ``commit.pt`` (the last commit) and ``commit.prev.pt`` (the one before). A commit is
written to ``.commit-XXXXXXXX.tmp`` (``mkstemp``: mode 0600, only its owner can read it;
``os.replace`` keeps the mode), then the current ``commit.pt`` is renamed to
``commit.prev.pt`` and the temporary onto ``commit.pt``. A rename is atomic on POSIX, so a
rank killed at any moment leaves either commit whole; killed between the two renames, only
``commit.prev.pt`` is there, and the restore takes it. There is no ``fsync`` (as
``torch.save``; torch's distributed checkpoint syncs): a killed process's writes are in the
page cache and survive it, and the failures this package handles are processes dying. A
crash of the whole machine can leave a renamed file whose data never reached the disk; the
restore then finds it damaged and falls back, or says how to start over.

Reading: ``torch.load(weights_only=True)``, which rebuilds tensors and plain types only and
refuses any other object without running it (the unrestricted unpickler can call any
function: a planted ``commit.pt`` would run its code in the agent). So a commit
holds only tensors and plain types (``check_plain`` says which value is not, at the commit),
and a file that holds anything else was not written by a commit: it is refused with a
``CommitError`` naming it and the objects. A damaged ``commit.pt`` (truncated, overwritten)
falls back to ``commit.prev.pt`` with a warning naming both (the steps since are trained
again); with no good previous commit it is a ``CommitError`` saying how to start over.
The safe unpickler is written in Python: tensors load as fast as before, but a field of
10,000 tuples adds about 50 ms to a restore here (1 ms with the unrestricted one), so
large records are better kept as tensors.

A shared commit directory: anyone who can write there can replace the training state.
``weights_only`` means they cannot run code in your process, but they can still change
the weights (or the step, or the optimizer state). ``prepare`` warns when the directory is
writable by others or owned by another user.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path

import torch

from ...errors import MinidistError

COMMIT_FILE, PREVIOUS_FILE = "commit.pt", "commit.prev.pt"
TEMPORARY = re.compile(r"\.commit-[A-Za-z0-9_]+\.tmp")  # mkstemp's names, and only those
KEYS = {"step", "world_size", "model", "sampler", "fields"}
PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.Size,
         torch.dtype, torch.device)
CONTAINERS = (list, tuple, set, dict, OrderedDict)


class CommitError(MinidistError):
    """A commit file cannot be used: damaged, or refused. ``path``: the file."""

    def __init__(self, path: Path, message: str):
        self.path = path
        super().__init__(message)


def check_plain(value, where: str) -> None:
    """Raise ``TypeError`` naming ``where`` if ``value`` holds anything but tensors and plain
    types (``PLAIN``, in lists, tuples, sets and dicts): what ``weights_only`` loads."""
    kind = type(value)
    if kind in PLAIN or kind in (torch.Tensor, torch.nn.Parameter):
        return
    if kind not in CONTAINERS:
        raise TypeError(f"{where} is a {kind.__module__}.{kind.__qualname__}: a commit holds "
                        "only tensors and plain types (None, bool, int, float, complex, str, "
                        "bytes, torch.Size/dtype/device, in lists, tuples, sets and dicts), "
                        "so that it loads with torch.load(weights_only=True); commit its "
                        "numbers instead (int(x), x.tolist(), dataclasses.asdict(x))")
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, f"{where}: the key {key!r}")
            check_plain(item, f"{where}[{key!r}]")
    else:
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")


class CommitStore:
    """The commits in ``directory``. ``warn``: whether falling back to ``commit.prev.pt``
    warns (the agent warns in your process and hands the ranks a quiet copy)."""

    def __init__(self, directory: str | os.PathLike, *, warn: bool = True):
        self.directory = Path(directory)
        self.path, self.prev = self.directory / COMMIT_FILE, self.directory / PREVIOUS_FILE
        self.warn, self.loaded_from = warn, None

    def quiet(self) -> CommitStore:
        """The same directory, without the fallback warning (the ranks' copy)."""
        return CommitStore(self.directory, warn=False)

    def prepare(self) -> None:
        """Before the first launch (the agent): make the directory (``mkdir -p``, mode
        0700), or say why it cannot hold commits; warn if others may write there."""
        _make_directory(self.directory)
        _warn_if_shared(self.directory)

    def remove_stale(self) -> list[Path]:
        """Remove the temporaries of writes cut short (a rank killed while committing), only
        those (``.commit-XXXXXXXX.tmp`` in this directory). The agent calls it before each
        launch, when no rank is alive: it owns the directory during a run, and a second
        writer there (another job) would race it, lose its temporaries and replace its
        commits: one job per commit directory."""
        stale = [p for p in self.directory.iterdir()
                 if TEMPORARY.fullmatch(p.name) and not p.is_dir()]
        for p in stale:
            p.unlink(missing_ok=True)
        return stale

    def save(self, payload: dict) -> None:
        """Write ``payload`` as the new ``commit.pt``; the current one becomes
        ``commit.prev.pt``, unless it is the damaged file the last ``load`` fell back from."""
        check_plain(payload, "the commit")
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".commit-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(payload, f)
            if self.path.exists() and self.loaded_from != self.prev:
                os.replace(self.path, self.prev)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.loaded_from = self.path

    def exists(self) -> bool:
        return self.path.exists() or self.prev.exists()

    def load(self, warn: bool | None = None) -> dict | None:
        """The last commit, or None before the first; ``loaded_from`` says which file;
        ``warn``: whether a fallback warns (default: ``self.warn``)."""
        self.loaded_from = None
        if not self.exists():
            return None
        try:
            payload = self.read(self.path)
        except _Damaged as e:
            payload = self._fall_back(e, self.warn if warn is None else warn)
        else:
            self.loaded_from = self.path
        return payload

    def _fall_back(self, damage: _Damaged, warn: bool) -> dict:
        if not self.prev.exists():
            raise CommitError(self.path, f"{damage} There is no previous commit "
                              f"({self.prev.name}) to fall back to. {_start_over(self)}")
        try:
            payload = self.read(self.prev)
        except _Damaged as e:
            raise CommitError(self.path, f"{damage} The previous commit is no better: {e} "
                              f"{_start_over(self)}") from None
        if warn:
            warnings.warn(f"{damage} Restored the previous commit {self.prev} (step "
                          f"{payload['step']}) instead: the steps after it are trained again, "
                          f"and the next commit replaces {self.path.name}.", stacklevel=3)
        self.loaded_from = self.prev
        return payload

    def read(self, path: Path) -> dict:
        """One commit file, loaded with ``weights_only=True``. Raises ``CommitError`` if it is
        damaged or holds anything a commit never holds (refused: nothing in it runs)."""
        if not path.exists():
            raise _Damaged(path, f"{path} is missing.")
        try:
            # onto the CPU: a commit written on a GPU restores anywhere (import_state puts
            # each tensor on its parameter's device)
            payload = torch.load(path, weights_only=True, map_location="cpu")
        except OSError:
            raise  # cannot be read at all (permissions): the OS's error names the file
        except Exception as e:  # torch raises 4 kinds for a damaged file
            raise _diagnose(path, e) from None
        if not isinstance(payload, dict) or set(payload) != KEYS:
            what = (f"the keys {sorted(map(str, payload))}" if isinstance(payload, dict)
                    else f"a {type(payload).__name__}")
            raise _Damaged(path, f"{path} is not a commit: it holds {what}, a commit the keys "
                           f"{sorted(KEYS)}.")
        return payload

    def step(self) -> int | None:
        """The committed step, or None before the first commit (reads the whole file)."""
        payload = self.load()
        return None if payload is None else int(payload["step"])

    def __repr__(self) -> str:
        return f"CommitStore({str(self.directory)!r})"


class _Damaged(CommitError):
    """A file that is not a whole commit (a previous commit may still serve)."""

    def __init__(self, path: Path, message: str):
        super().__init__(path, message)


def _diagnose(path: Path, error: Exception) -> CommitError:
    """Refused (objects no commit holds: named, statically, nothing runs) or damaged."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not even a torch.save archive
        return _Damaged(path, f"{path} is damaged: it is not a whole torch.save archive "
                        f"({path.stat().st_size} bytes: cut short by a crash of the machine, "
                        "or overwritten).")
    if unsafe:
        return CommitError(path, f"{path} refused: it holds objects a commit never contains "
                           f"({', '.join(unsafe)}), so md.elastic did not write it: it may have "
                           "been planted. It was not loaded and nothing in it ran "
                           "(torch.load(weights_only=True)). Check who can write to "
                           f"{path.parent}; delete the file, or point commit_dir at a "
                           "directory only you can write.")
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else repr(error)
    return _Damaged(path, f"{path} is damaged ({type(error).__name__}: {first}).")


def _start_over(store: CommitStore) -> str:
    files = " and ".join(str(p) for p in (store.path, store.prev) if p.exists())
    return (f"To start over, delete {files} (training restarts from step 0), or point "
            "commit_dir at a fresh directory.")


def _make_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"commit_dir {str(directory)!r} is a file, not a directory: "
                                 "commits are files in a directory (commit.pt and its "
                                 "temporaries); pass a directory's path (it is created if "
                                 "missing)")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"commit_dir {str(directory)!r} cannot be created ({e.strerror}: "
                      f"{e.filename}); pass a directory you can write, or create it") from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"commit_dir {str(directory)!r} is not writable by you: the "
                              "commits cannot be written there; pass a directory you own")


def _warn_if_shared(directory: Path) -> None:
    info = directory.stat()
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or info.st_uid != os.geteuid():
        warnings.warn(f"commit_dir {str(directory)!r} (mode {stat.filemode(info.st_mode)}, "
                      f"owner uid {info.st_uid}) can be written by other users: anyone who "
                      "can write there can replace the training state. Commits load with "
                      "weights_only=True, so they cannot run code in your process, but they "
                      "can change the weights. Use a directory only you can write "
                      "(mkdir -m 700).", stacklevel=3)

