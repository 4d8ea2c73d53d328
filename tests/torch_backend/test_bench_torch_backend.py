"""``minidist bench torch-backend --quick`` runs end to end: table, JSON with every row, a
plot (timings are reported, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_torch_backend_quick(tmp_path):
    out, png = tmp_path / "tb.json", tmp_path / "tb.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "torch-backend", "--quick", "--json",
         str(out), "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "the steps/s of torch DDP over gloo" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["world_size"], r["variant"]) for r in rows} == {
        (2, "over minidist"), (2, "over gloo")}
    for r in rows:
        assert r["steps_per_s"] > 0 and 0 <= r["comm_share"] < 1 and r["vs_gloo"] > 0
    assert png.stat().st_size > 1000
