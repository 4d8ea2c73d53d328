"""``minidist bench pipeline --quick`` runs end to end: table, JSON with every row, a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_bench_pipeline_quick(tmp_path):
    out, png = tmp_path / "pipeline.json", tmp_path / "pipeline.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "pipeline", "--quick", "--network",
         "--json", str(out), "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "the steps/s of torch's Schedule1F1B" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    minidist = ("minidist naive", "minidist GPipe", "minidist 1F1B", "minidist interleaved")
    torch = ("torch GPipe", "torch 1F1B", "torch interleaved")
    assert {(r["model"], r["stages"], r["variant"]) for r in rows} == {
        ("tiny", 2, v) for v in minidist + torch} | {
        ("tiny", 2, f"{v} (emulated)") for v in minidist}
    by = {r["variant"]: r for r in rows}
    for r in rows:
        assert r["steps_per_s"] > 0 and 0 <= r["bubble"] < 1 and len(r["peak_bytes"]) == 2
        assert r["formula"] == pytest.approx(1 / (r["chunks"] * r["microbatches"] + 1))
        assert r["chunks"] == (2 if "interleaved" in r["variant"] else 1)
    # the same meter on the same split model: GPipe holds all 4 micro-batches, 1F1B fewer
    assert by["minidist GPipe"]["peak_bytes"] == by["torch GPipe"]["peak_bytes"]
    assert by["minidist 1F1B"]["peak_bytes"] == by["torch 1F1B"]["peak_bytes"]
    assert by["minidist interleaved"]["vs_torch"] > 0
    assert by["minidist 1F1B"]["peak_bytes"][0] < by["minidist GPipe"]["peak_bytes"][0]
    assert by["minidist 1F1B"]["vs_torch"] > 0 and by["minidist naive"]["vs_torch"] is None
    assert png.stat().st_size > 1000
