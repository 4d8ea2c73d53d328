"""``minidist bench elastic --quick`` runs end to end: table, JSON with every row, a plot;
the lost steps are what the commit interval says (``costs.lost_steps``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from minidist.bench.elastic import QUICK
from minidist.parallel.elastic import lost_steps


def test_bench_elastic_quick(tmp_path):
    out, png = tmp_path / "elastic.json", tmp_path / "elastic.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "elastic", "--quick", "--commit-every",
         "4", "--json", str(out), "--plot", str(png), "--torch-timeout", "120"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "Young's interval" in proc.stdout and "torchrun" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["impl"], r["k"]) for r in rows] == [("minidist", 4), ("torchrun", 4)]
    for r in rows:
        if r["impl"] == "minidist":
            assert r["finished"]
        if r["finished"]:  # torchrun's row may say it hung (killed after the timeout)
            assert r["lost_steps"] == lost_steps(QUICK["fail_at"], r["k"])
            assert r["restarts"] >= 1 and r["recovery_s"] > 0 and r["step_ms"] > 0
    assert png.stat().st_size > 1000
