"""``minidist bench amp --quick`` runs end to end: table, JSON with every row, a plot, and the
16-bit rows of minidist send half the bytes of its fp32 row."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_amp_quick(tmp_path):
    out, png = tmp_path / "amp.json", tmp_path / "amp.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minidist.cli", "bench", "amp", "--quick", "--json", str(out),
         "--plot", str(png)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, CI="true"))
    assert proc.returncode == 0, proc.stderr
    assert "vs torch" in proc.stdout and "no float16" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["precision"], r["impl"]) for r in rows} == {
        (p, i) for p in ("fp32", "fp16", "bf16") for i in ("minidist", "torch")}
    for r in rows:
        assert r["ms"] > 0 and r["memory_bytes"] > 0 and r["final_loss"] > 0
        if r["impl"] == "minidist":
            assert r["bytes_source"] == "comm.stats"
            # half, plus fp16's 4-byte found_inf agreement per step (GradScaler(comm=comm))
            want = 1.0 if r["precision"] == "fp32" else 0.5
            assert want <= r["bytes_vs_fp32"] < want + 1e-3
    assert png.stat().st_size > 1000
