"""The grading tests' leak check: as the suite's (``tests/conftest.py``), but the grader's
fork server and multiprocessing's resource tracker stay: ``minidist grade`` starts them once
and every later test's fresh children come from them (``engine/fresh.py``)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from minidist.grading.engine.fresh import service_pids

_spec = importlib.util.spec_from_file_location(  # the suite's conftest, under its own name
    "suite_conftest", pathlib.Path(__file__).resolve().parents[1] / "conftest.py")
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
child_pids, our_segments = _suite.child_pids, _suite.our_segments


@pytest.fixture(autouse=True)
def no_leaks():
    """After each test: no child process of ours but the grader's services is alive, no
    shared-memory segment of ours is left."""
    before = child_pids()
    yield
    leaked_procs = child_pids() - before - service_pids()
    leaked_shm = our_segments()
    assert not leaked_procs, f"processes outlived the test: {sorted(leaked_procs)}"
    assert not leaked_shm, f"shared memory outlived the test: {sorted(leaked_shm)}"
