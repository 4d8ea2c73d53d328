"""Imported by the fork server of the grader's fresh children (``fresh.py``): torch, the
library and the grader's exercises, loaded once, so that each child starts at once and no
module of the library needs reading from disk once the learner's code runs (the sandbox then
refuses to open the library's sources: see ``sandbox.close_library_sources``)."""

from __future__ import annotations

import importlib
import pkgutil

import torch  # noqa: F401  (loaded once, here)

import minidist
from minidist.grading import registry  # noqa: F401  (every exercise's checks and ranks)

SKIPPED = ("minidist.horovod", "minidist.torch_backend.tests")  # optional, heavy extras


def import_all() -> None:
    """Every importable module of the library (optional ones that fail are skipped)."""
    for info in pkgutil.walk_packages(minidist.__path__, "minidist."):
        if info.name.startswith(SKIPPED) or ".__main__" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # an optional dependency missing: nothing there to reach
            continue


import_all()
