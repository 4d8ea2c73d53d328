"""``minidist bench emulation --quick`` runs end to end: both tables, JSON with every row."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from minidist.bench.emulation import VARIANTS
from minidist.bench.emulation_scenarios import SCENARIOS


def test_bench_emulation_quick(tmp_path):
    out = tmp_path / "emulation.json"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "emulation", "--quick", "--json",
         str(out)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "costs at most" in proc.stdout and "virtual / predicted" in proc.stdout
    result = json.loads(out.read_text())
    assert {(r["world_size"], r["variant"]) for r in result["cost"]} == {
        (p, v) for p in (2, 4) for v in VARIANTS}
    for r in result["cost"]:
        assert r["step_s"] > 0 and (r["vs_local"] == 1.0) == (r["variant"] == "local")
    assert {(r["scenario"], r["ranks"]) for r in result["fidelity"]} == {
        (s, p) for s in SCENARIOS for p in (2, 4)}
    for r in result["fidelity"]:  # virtual times are the model's: close to every formula
        if r["scenario"].startswith("sync PS"):
            # the workers' pushes meet on the server's port at one virtual instant and book
            # it in wall-clock order: a step now and then is slower (never faster); the
            # fastest step is checked against it in tests/transports/test_virtual_*.py.
            assert r["ratio"] > 0.95, r
        else:
            assert 0.8 < r["ratio"] < 1.25, r
    flops, cpu = ({r["variant"]: r for r in result["load"]}[v] for v in ("FLOPs", "CPU time"))
    assert flops["loaded_ms"] == flops["alone_ms"] > 0  # the FLOP model ignores the load
    assert cpu["alone_ms"] > 0 and cpu["ratio"] > 0  # CPU time: a reading, not asserted
    assert "3. Load" in proc.stdout
