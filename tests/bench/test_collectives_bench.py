"""``minidist bench collectives`` runs end to end (small sizes, one world size): the table,
the fits, the JSON (whose ``"fit"`` ``auto`` can load) and the plot. It measures; it asserts
nothing about speed."""

from __future__ import annotations

import json
import subprocess
import sys

from minidist.collectives import auto
from minidist.costmodel import collectives as costs


def test_bench_collectives_quick(tmp_path):
    out = tmp_path / "c.json"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "collectives", "--quick",
         "--world-sizes", "2", "--max-size", "65536", "--json", str(out),
         "--plot", str(tmp_path / "c.png")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fit of each path's cost formula" in proc.stdout and "auto picks" in proc.stdout
    data = json.loads(out.read_text())
    algos = {r["algorithm"] for r in data["rows"]}
    assert {"naive", "tree", "ring", "halving_doubling", "auto", "shm", "gloo"} <= algos
    assert [n for n in data["sizes"]][0] == 4 and max(data["sizes"]) <= 65536
    for r in data["rows"]:
        assert r["time_us"] > 0 and r["busbw_GBps"] == r["algbw_GBps"]  # p = 2: factor 1
    assert set(data["call_fits"]["2"]) >= algos - {"auto"} | {"gloo"}
    assert set(data["fit"]["2"]) == set(costs.ALL_REDUCE_PATHS)
    assert data["date"] and data["machine"]["cpus"] >= 1
    table = auto.read_costs(out)  # what MINIDIST_COSTS or load_costs would use
    assert set(table[2]) == set(costs.ALL_REDUCE_PATHS)
    assert (tmp_path / "c.png").stat().st_size > 1000
