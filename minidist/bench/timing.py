"""Shared pieces of the benchmarks: common options, timing loops, tables, the GPT presets'
config, JSON and plots. (``quick_mode`` lives in ``minidist.notebook``.)

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
from types import ModuleType

import numpy as np
import torch

from ..models import GPTConfig


def add_common_arguments(parser, quick_help: str, *, json_help: str = "write the results as JSON",
                         plot_help: str | None = "save a plot", rounds: bool = True) -> None:
    """The options every benchmark shares: ``--quick`` (``quick_help`` says what it shrinks),
    ``--json PATH``, ``--plot PATH`` (left out when ``plot_help`` is None) and, with ``rounds``,
    ``--rounds`` (for :func:`best_of_rounds`). A benchmark adds its own options after these."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", metavar="PATH", help=json_help)
    if plot_help is not None:
        parser.add_argument("--plot", metavar="PATH", help=plot_help)
    if rounds:
        parser.add_argument("--rounds", type=int, help="repeat each run, report the best")


def gpt_config(cfg: dict, tie_weights: bool = False) -> GPTConfig:
    """The GPT a benchmark preset describes: ``block``, ``n_layer``, ``n_embd`` and, where the
    preset names them, ``vocab`` (else 96, CharText's alphabet) and ``n_head`` (else 4 heads
    from width 64 up, 2 below). Untied unless asked: a model cut into pipeline stages cannot
    share one tensor between its first and last stage."""
    n_head = cfg.get("n_head", 4 if cfg["n_embd"] >= 64 else 2)
    return GPTConfig(vocab_size=cfg.get("vocab", 96), block_size=cfg["block"],
                     n_layer=cfg["n_layer"], n_head=n_head, n_embd=cfg["n_embd"],
                     tie_weights=tie_weights)


def iterations_for(nbytes: int, quick: bool) -> int:
    """Enough repetitions for a stable median at small sizes, few at large ones."""
    budget = 2e8 if quick else 2e9  # bytes moved per size, roughly
    lo, hi = (3, 50) if quick else (5, 1000)
    return int(max(lo, min(hi, budget // max(nbytes, 1))))


def fit_relative(terms, seconds) -> tuple[float, float]:
    """Fit t = a * alpha + b / beta to measured ``seconds``, one (a, b) pair of ``terms``
    per point (messages and bytes); returns (alpha seconds, beta bytes/s).

    Least squares on *relative* error (each row divided by its measured time): a plain fit
    would let the 64 MiB point, a thousand times longer than the rest, decide alpha alone.
    """
    t = np.asarray(seconds, dtype=float)
    a = np.asarray(terms, dtype=float) / t[:, None]
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)
    return float(alpha), float(1 / inv_beta) if inv_beta > 0 else float("inf")


def fit_alpha_beta(sizes, seconds) -> tuple[float, float]:
    """The Hockney model t(n) = alpha + n / beta fitted to one message per size."""
    return fit_relative([(1, n) for n in sizes], seconds)


def median_time(fn, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def local_shard(t):
    """A DTensor's local shard on this rank, or the tensor itself (torch's tensor parallelism
    and FSDP2 hold DTensors: what a rank stores is its shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


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


def save_outputs(args, result: dict, draw: Callable[[str], None] | None = None) -> dict:
    """The end of every ``main``: write ``--json``, draw ``--plot`` with ``draw(path)`` (only
    when a ``draw`` is given: a benchmark without plots has no ``--plot``), return ``result``."""
    if args.json:
        save_json(args.json, result)
    if draw is not None and args.plot:
        draw(args.plot)
    return result


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (files, no window). Imported here, on first
    use, so that ``minidist bench --help`` never pays for matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> None:
    """Every bench's figure is written the same way: laid out, 120 dpi."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
