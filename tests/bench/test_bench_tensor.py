"""``minidist bench tensor --quick`` runs end to end: table, JSON with every row, a plot; the
bytes minidist counts per step equal the formula for the paths its all-reduces took."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_tensor_quick(tmp_path):
    out, png = tmp_path / "tensor.json", tmp_path / "tensor.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "tensor", "--quick", "--json", str(out),
         "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "torch DTensor" in proc.stdout and "the steps/s of torch DTensor" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    names = {(r["world_size"], r["variant"]) for r in rows}
    assert names >= {(p, v) for p in (1, 2)
                     for v in ("minidist", "minidist naive MLP", "minidist sequence parallel",
                               "torch DTensor")}
    assert (2, "minidist, NVLink 4 (emulated)") in names
    for r in rows:
        assert r["steps_per_s"] > 0 and 0 <= r["comm_share"] <= 1
        if r["variant"] == "torch DTensor":
            assert r["bytes"] is None
        else:
            assert r["bytes"] == r["formula_bytes"], r
        assert (r["world_size"] == 1) == (r["memory_vs_full"] == 1.0)
        assert r["saved_bytes"] > 0
    assert png.stat().st_size > 1000
