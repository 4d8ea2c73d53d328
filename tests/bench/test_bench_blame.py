"""``minidist bench blame --runs 1 --busy 0.2`` runs end to end on both backends, and every
cell blames the rank that left (issue 23, item 9; the 200-run figure comes from a full run)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_blame_smoke(tmp_path):
    out = tmp_path / "blame.json"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "blame", "--runs", "1", "--busy", "0.2",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "blamed another" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["backend"], r["scenario"]) for r in rows} == {
        (b, s) for b in ("local", "torch") for s in ("raise", "return", "exit", "kill", "recv")}
    assert all(r["runs"] == r["right"] == 1 for r in rows), [r["wrong"] for r in rows]
