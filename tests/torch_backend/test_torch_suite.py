"""torch's own distributed test suite as the peer: the chosen tests of
``torch/testing/_internal/distributed/distributed_test.py`` (``torch_suite.CHOSEN``) run
against the minidist backend, every one of them (none skipped), through minidist's
process group on every rank (the driver checks), within 5 minutes on 2 cores."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("expecttest", reason="torch's test suite needs expecttest (dev extra)")

DRIVER = Path(__file__).with_name("torch_suite.py")


def test_torch_suite_passes_against_minidist():
    proc = subprocess.run([sys.executable, str(DRIVER)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    got = re.search(r"minidist torch suite: (\d+) chosen, (\d+) ran, (\d+) skipped", proc.stdout)
    assert got, tail
    chosen, ran, skipped = map(int, got.groups())
    assert ran == chosen >= 25 and skipped == 0, tail
    assert "backend calls, all ranks: " in proc.stdout
