"""``minidist bench comm --quick`` runs end to end: the topology table with its goal line,
JSON whose bytes across nodes are exactly the prediction, a plot; with the compression half
when ``minidist.bench.comm_compression`` is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest


def _bench(tmp_path, *extra):
    out, png = tmp_path / "comm.json", tmp_path / "comm.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "comm", "--quick", "--json", str(out),
         "--plot", str(png), *extra], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text()), png


def test_bench_comm_topology_quick(tmp_path):
    stdout, data, png = _bench(tmp_path, "--only", "topology")
    assert set(data) == {"topology", "machine"}
    assert "Goal: hierarchical at least 1.5x the flat ring" in stdout
    rows = data["topology"]["rows"]
    sizes = data["topology"]["config"]["sizes"]
    assert {(r["where"], r["algorithm"], r["bytes"]) for r in rows
            if r["placement"] == "block"} == {
        (w, a, n) for n in sizes for w, algos in (
            ("emulated", ("ring", "tree", "hierarchical")),
            ("this machine", ("ring", "tree", "hierarchical", "gloo"))) for a in algos}
    for r in rows:
        assert r["ms"] > 0 and r["vs_ring"] > 0
        if r["where"] == "emulated":  # counted by comm.stats == the cost model, exactly
            assert r["across"] == r["predicted_across"], r
            assert r["predicted_ms"] > 0
    rr = {r["algorithm"]: r["across"] for r in rows if r["placement"] == "round_robin"}
    assert rr["ring"] == 2 * rr["topology_ring"]  # 2x2 round-robin: 4 crossing hops, not 2
    goal = data["topology"]["goal"]
    assert set(goal["hierarchical_vs_ring"]) == {str(n) for n in sizes}
    assert goal["met"] == (goal["best"] >= 1.5)
    assert png.stat().st_size > 1000


@pytest.mark.skipif(importlib.util.find_spec("minidist.bench.comm_compression") is None,
                    reason="the compression half is not installed")
def test_bench_comm_both_halves_quick(tmp_path):
    stdout, data, png = _bench(tmp_path)
    assert {"topology", "compression"} <= set(data)
    assert "Goal: hierarchical" in stdout and "Goal: PowerSGD" in stdout
    assert png.stat().st_size > 1000
