"""``minidist bench ddp --quick`` runs end to end: table, JSON with every row, a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_ddp_quick(tmp_path):
    out, png = tmp_path / "ddp.json", tmp_path / "ddp.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "ddp", "--quick", "--json", str(out),
         "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "torch DDP" in proc.stdout and "the steps/s of torch DDP" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["world_size"], r["variant"]) for r in rows} == {
        (p, v) for p in (1, 2)
        for v in ("minidist overlap", "minidist after", "minidist naive", "torch DDP")}
    for r in rows:
        assert r["steps_per_s"] > 0 and 0 <= r["comm_share"] < 1
        assert (r["allreduce_ms"] is None) == (r["variant"] in ("torch DDP", "minidist naive"))
    assert png.stat().st_size > 1000
