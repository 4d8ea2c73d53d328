"""``minidist bench ps --quick`` runs end to end: three tables, JSON with every row, a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_ps_quick(tmp_path):
    out, png = tmp_path / "ps.json", tmp_path / "ps.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "ps", "--quick", "--json", str(out),
         "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "the steps/s of torch's RPC parameter server" in proc.stdout
    result = json.loads(out.read_text())
    systems = ("PS 1 server", "PS 2 servers", "ring DDP")
    here = ("PS 1 server", "PS 1 server, messages", "PS 2 servers", "ring DDP", "torch RPC PS",
            "lock-step floor")
    assert {(r["workers"], r["system"]) for r in result["local"]} == {
        (w, s) for w in (1, 2) for s in here}
    for r in result["local"]:  # shared memory or messages: the same bytes into the server
        if r["system"].startswith("PS 1 server"):
            assert r["server_in_per_step"] == r["workers"] * result["config"]["model_bytes"]
    assert {(r["link"], r["workers"], r["system"]) for r in result["emulated"]} == {
        (link, w, s) for link in ("10 GbE", "1 GbE") for w in (1, 2) for s in systems}
    for r in result["local"] + result["emulated"]:
        assert r["steps_per_s"] > 0 and r["compute_ms"] > 0
    for r in result["emulated"]:
        if r["system"] != "ring DDP":  # measured from the servers' reports, exactly W*N/S
            assert abs(r["server_in_per_step"] - r["predicted_in"]) <= 0.1 * r["predicted_in"]
    assert [r["mode"] for r in result["straggler"]] == ["sync", "ssp (s=2)", "async"]
    assert result["straggler"][0]["max_staleness"] == 0
    assert png.stat().st_size > 1000
