"""``minidist bench hybrid --quick --network`` runs end to end: the measured table for every
layout of 4 ranks (minidist, torch's DTensor x data-parallel pieces where pp = 1, minidist on
the emulated 2-node cluster with the dimensions that cross nodes), the predicted table for
every layout of the described 8-GPU cluster, JSON and a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from minidist.costmodel.planner import layouts


def test_bench_hybrid_quick(tmp_path):
    out, png = tmp_path / "hybrid.json", tmp_path / "hybrid.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "hybrid", "--quick", "--json", str(out),
         "--plot", str(png), "--network"], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "Predicted: GPT 6.7B" in proc.stdout and "<- fastest that fits" in proc.stdout
    result = json.loads(out.read_text())
    rows = result["rows"]
    got = {(r["dp"], r["pp"], r["tp"], r["variant"]) for r in rows}
    want = {(*layout, "minidist") for layout in layouts(4)}
    want |= {(*layout, "torch") for layout in layouts(4) if layout[1] == 1}
    want |= {(*layout, "minidist (emulated)") for layout in layouts(4)}
    assert got == want
    for r in rows:
        assert r["steps_per_s"] > 0 and r["state_bytes"] > 0
        assert (r["activation_bytes"] is None) == (r["variant"] == "torch")
        if r["variant"] == "minidist (emulated)":  # 2 nodes of 2: tp=4 crosses, tp=2 not
            assert ("tp" in r["crossing"]) == (r["tp"] == 4), r
            assert r["vs_torch"] is None
    predicted = result["predicted"]
    assert [(r["dp"], r["pp"], r["tp"]) for r in predicted] == layouts(8)
    for r in predicted:
        parts = sum(r[k] for k in ("compute_s", "bubble_s", "tp_s", "pp_s", "dp_s"))
        assert abs(r["step_s"] - parts) < 1e-9
        assert r["fits"] == (r["memory_bytes"] <= result["cluster"]["memory"])
    assert png.stat().st_size > 1000
