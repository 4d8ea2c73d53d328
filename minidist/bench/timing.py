"""Shared pieces of the benchmarks: quick mode, timing loops, tables, JSON and plots.

Benchmarks measure; they never assert. Each one runs minidist and the real system side by
side in one run, on the same machine at the same time, and reports ratios.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch


def quick_mode() -> bool:
    """CI (``CI=true``) and ``MINIDIST_QUICK=1`` shrink sweeps to a few seconds."""
    return os.environ.get("MINIDIST_QUICK", "") not in ("", "0") or \
        os.environ.get("CI", "").lower() in ("1", "true")


def iterations_for(nbytes: int, quick: bool) -> int:
    """Enough repetitions for a stable median at small sizes, few at large ones."""
    budget = 2e8 if quick else 2e9  # bytes moved per size, roughly
    lo, hi = (3, 50) if quick else (5, 1000)
    return int(max(lo, min(hi, budget // max(nbytes, 1))))


def median_time(fn, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.0f} {unit}"
        n /= 1024
    return str(n)


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns``: (key, header, format spec). Returns aligned text."""
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        cells.append([_fmt(row.get(k), f) for k, _, f in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    if spec == "bytes":
        return human_bytes(value)
    return format(value, spec)


def machine_info() -> dict:
    return {"cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform()}


def save_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(dict(payload, machine=machine_info()), f, indent=2)


def best_of_rounds(cases: list[tuple[dict, Callable[[], dict]]], rounds: int) -> list[dict]:
    """Run every case once per round, the cases interleaved so that all of them see the same
    machine, ``rounds`` times. Each row is a case's best round (other processes only ever slow
    a run down) with the case's fields and every round's time in ``rounds_ms``. A run returns
    a dict holding ``step_s``."""
    samples: list[list[dict]] = [[] for _ in cases]
    for _ in range(rounds):
        for runs, (_, run) in zip(samples, cases):
            runs.append(run())
    return [dict(min(runs, key=lambda r: r["step_s"]), **fields,
                 rounds_ms=[r["step_s"] * 1e3 for r in runs])
            for runs, (fields, _) in zip(samples, cases)]
