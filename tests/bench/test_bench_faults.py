"""``minidist bench faults --kills 5`` runs end to end: a table, JSON with every trial, and
nothing left behind by any kill (issue 10's stress script; the figure comes from a full run)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_faults_smoke(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "faults", "--kills", "5", "--seed", "3",
         "--scenarios", "launch,nested", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "5 kills in" in proc.stdout and "segments left" in proc.stdout
    data = json.loads(out.read_text())
    assert len(data["trials"]) == 5 and sum(r["kills"] for r in data["rows"]) == 5
    assert all(r["segments"] == r["procs"] == r["hangs"] == 0 for r in data["rows"]), data
