"""``minidist doctor --gpu`` (``minidist/doctor_gpu.py``) without a GPU: it says that none is
present and exits non-zero; with torch made to claim one, it runs the GPU tests and every
benchmark row and its status follows their results (the rows themselves need a GPU)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from minidist import cli, doctor_gpu


def test_without_a_gpu_it_says_so_and_fails(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["doctor", "--gpu"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is present" in err and "nothing was verified" in err
    assert doctor_gpu.main() == 2


def _claim_a_gpu(monkeypatch, tests_pass: bool, rows: list):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(doctor_gpu, "run_gpu_tests", lambda: tests_pass)
    monkeypatch.setattr(doctor_gpu, "ring_row", lambda: rows[0])
    monkeypatch.setattr(doctor_gpu, "ddp_row", lambda half: rows[1 + half])


GOOD = [("ring", "ok", True), ("ddp", "ok", True), ("amp", "ok", True)]


@pytest.mark.parametrize("tests_pass, bad_row, status", [
    (True, None, 0), (False, None, 1), (True, 2, 1)])
def test_status_follows_the_tests_and_the_checks(monkeypatch, capsys, tests_pass, bad_row,
                                                 status):
    rows = list(GOOD)
    if bad_row is not None:
        rows[bad_row] = ("amp", "parameters differ", False)
    _claim_a_gpu(monkeypatch, tests_pass, rows)
    assert doctor_gpu.main() == status
    out = capsys.readouterr().out
    assert all(f"{name}: {text}" in out for name, text, _ in rows)
    assert ("<- FAILED" in out) == (bad_row is not None)


def test_a_failing_row_is_reported_not_raised(monkeypatch, capsys):
    _claim_a_gpu(monkeypatch, True, GOOD)

    def broken():
        raise RuntimeError("NCCL error: unhandled system error")
    monkeypatch.setattr(doctor_gpu, "ring_row", broken)
    assert doctor_gpu.main() == 1
    assert "RuntimeError: NCCL error" in capsys.readouterr().out


def test_one_gpu_skips_the_nccl_row_and_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    name, text, good = doctor_gpu.ring_row()
    assert good and "needs 2 GPUs or more" in text and "has 1" in text


def test_the_suite_it_runs_is_pytest_m_gpu(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd, **kw: calls.append((cmd, kw)) or
                        subprocess.CompletedProcess(cmd, 1))
    assert doctor_gpu.run_gpu_tests() is False  # the fake pytest failed
    cmd, kw = calls[0]
    assert cmd[1:5] == ["-m", "pytest", "-m", "gpu"] and kw["cwd"] == doctor_gpu.ROOT
    assert (Path(kw["cwd"]) / "tests" / "gpu" / "conftest.py").is_file()
    assert doctor_gpu.run_gpu_tests(root=tmp_path) is False  # no tests/ there
    assert len(calls) == 1
