"""``minidist bench costmodel --quick --emulated`` runs end to end: every strategy measured
here and predicted by ``md.costmodel`` (the ``alone`` rows calibrate, so their ratio is 1), the
predicted parts adding up, the model state matching the measured bytes, JSON and a plot.
Ratios of the other rows are reported by the bench, never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_bench_costmodel_quick(tmp_path):
    out, png = tmp_path / "costmodel.json", tmp_path / "costmodel.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "costmodel", "--quick", "--emulated",
         "--json", str(out), "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "pred/meas" in proc.stdout and "default_costs.json" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    got = {(r["strategy"], r["layout"], r["network"]) for r in rows}
    want = {("alone", "1x1x1", "this machine")} | {
        (s, layout, net) for s, layout in (("DDP", "2x1x1"), ("ZeRO-1", "2x1x1"),
                                           ("ZeRO-3", "2x1x1"), ("pipeline 1F1B", "1x2x1"),
                                           ("tensor parallel", "1x1x2"))
        for net in ("this machine", "25 GbE (emulated)")}
    assert got == want
    for r in rows:
        assert r["measured_ms"] > 0 and r["predicted_ms"] > 0
        parts = ("compute_ms", "tp_ms", "pp_ms", "bubble_ms", "dp_ms")
        assert r["predicted_ms"] == pytest.approx(sum(r[k] for k in parts))
        assert r["ratio"] == pytest.approx(r["predicted_ms"] / r["measured_ms"])
        assert 0.9 < r["state_ratio"] <= 1.0  # TP and PP replicate a few small tensors
    assert sorted(r["world"] for r in rows if r["strategy"] == "alone") == [1, 2]
    assert all(r["ratio"] == pytest.approx(1.0) for r in rows if r["strategy"] == "alone")
    emulated = {r["strategy"]: r for r in rows if r["network"] != "this machine"}
    plain = {r["strategy"]: r for r in rows if r["network"] == "this machine"}
    assert all(emulated[s]["predicted_ms"] > plain[s]["predicted_ms"] for s in emulated)
    assert png.stat().st_size > 1000
