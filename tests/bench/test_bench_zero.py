"""``minidist bench zero --quick`` runs end to end: table, JSON with every row, a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_zero_quick(tmp_path):
    out, png = tmp_path / "zero.json", tmp_path / "zero.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "zero", "--quick", "--json", str(out),
         "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "torch ZeroRedundancyOptimizer" in proc.stdout and "torch fully_shard" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["stage"], r["variant"].split()[0]) for r in rows} == {
        (s, who) for s in range(4) for who in ("minidist", "torch")}
    for r in rows:
        assert r["steps_per_s"] > 0 and r["memory"]["total"] > 0
        if r["variant"].startswith("minidist"):
            assert r["bytes"] == r["formula_bytes"] or r["stage"] == 0  # 0: shm all-reduce
            assert r["vs_torch"] > 0
    ours = {r["stage"]: r["memory"]["total"] for r in rows
            if r["variant"] == f"minidist stage {r['stage']}"}
    assert ours[0] > ours[1] > ours[2] > ours[3]  # each stage shards one more part
    assert png.stat().st_size > 1000
