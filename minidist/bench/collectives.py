"""``minidist bench collectives``: all_reduce algorithms on the local backend vs gloo.

For world sizes 2 and 4 and sizes from 4 bytes to 64 MiB (float32), one run times every
minidist all_reduce algorithm on the local (shared-memory) backend, the local backend's
shared-memory fast path (``shm``) on its own, ``auto``, and ``torch.distributed.all_reduce``
on gloo, side by side. Per row: median time per call (the slowest rank's median), algorithm
bandwidth algbw = n / t and bus bandwidth busbw = algbw * 2(p-1)/p (the nccl-tests
convention: the load on the busiest link, comparable across world sizes), and the speedup
over gloo (gloo's time / this time). minidist and gloo take turns in three rounds and each
row keeps its best round, so that a burst of other work on a shared machine does not decide
a comparison. Then two fits per algorithm: of the whole call, t(n) = alpha + n / beta
(``"call_fits"``, gloo included), and of the algorithm's own cost formula,
t = ``costs.time(path, n, p, alpha, beta)`` with alpha per message and beta per link
(``"fit"``: least squares on relative error over the formula's message and byte counts,
Thakur, Rabenseifner and Gropp 2005). ``--json PATH`` writes both, with the machine and the
date; ``MINIDIST_COSTS=PATH`` (or ``md.collectives.auto.load_costs(PATH)``) then makes
``auto`` choose by this machine's figures instead of the shipped ``default_costs.json``.
"""

from __future__ import annotations

import datetime

import torch

from ..collectives import ALL_REDUCE_ALGORITHMS, all_reduce
from ..collectives import shared_memory as shm_collectives
from ..collectives.agreement import agree, describe
from ..collectives.auto import choose
from ..costmodel import collectives as costs
from ..launch import launch
from ..notebook import quick_mode
from .timing import (
    add_common_arguments,
    fit_alpha_beta,
    fit_relative,
    format_table,
    iterations_for,
    median_time,
    pyplot,
    save_figure,
    save_outputs,
)

SIZES = [4 << (2 * k) for k in range(13)]  # 4 B, 16 B, ..., 64 MiB
QUICK_SIZES = [4, 1024, 64 << 10, 1 << 20, 16 << 20]
ALGORITHMS = [a for a in ALL_REDUCE_ALGORITHMS if a != "auto"] + ["shm", "auto"]
ROUNDS = 3
MODEL = ("fit: per world size and all_reduce path, alpha (seconds per message or barrier) and "
         "beta (bytes/s) of the path's cost formula, t = minidist.costmodel.collectives.time(path, "
         "nbytes, p, alpha, beta); call_fits: the whole call, t = alpha + n / beta")


def add_arguments(parser) -> None:
    add_common_arguments(parser, "a short sweep (CI does this)",
                         plot_help="save a bus-bandwidth plot", rounds=False)
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated (default 2,4)")
    parser.add_argument("--max-size", type=int, help="largest size in bytes")


def _time_minidist(comm, sizes, algorithms, iters):
    """On every rank: {algorithm: {bytes: median seconds}} and auto's choice per size."""
    times, picks = {a: {} for a in algorithms}, {}
    for algo in algorithms:  # warm up: first-touch page faults, lazy initialisation
        _one(comm, torch.zeros(1 << 18), algo)
    for n in sizes:
        x = torch.zeros(n // 4)
        picks[n] = choose(comm, x)
        for algo in algorithms:
            comm.barrier()
            times[algo][n] = median_time(lambda a=algo, x=x: _one(comm, x, a), iters[n], 2)
    return times, picks


def _one(comm, x, algo):
    if algo == "shm":  # the local backend's fast path on its own (and the same agreement
        agree(comm, describe("all_reduce", x, op="sum", algorithm="auto"))  # check as all)
        return shm_collectives.all_reduce_shm(comm, x, "sum")
    return all_reduce(comm, x, algorithm=algo)


def _time_gloo(comm, sizes, iters):
    import torch.distributed as dist

    times = {}
    dist.all_reduce(torch.zeros(1 << 18))
    for n in sizes:
        x = torch.zeros(n // 4)
        dist.barrier()
        times[n] = median_time(lambda x=x: dist.all_reduce(x), iters[n], 2)
    return times


def measure(world_size: int, sizes, quick: bool) -> tuple[list[dict], dict]:
    """Rows (one per algorithm and size) and auto's picks for one world size.

    The machine is shared, so a burst of someone else's work can land on one
    measurement: minidist and gloo take turns, ``ROUNDS`` times, and each row keeps its
    best round (the slowest rank's median in that round).
    """
    rounds = 1 if quick else ROUNDS
    iters = {n: max(3, iterations_for(n, quick) // rounds) for n in sizes}
    best = {a: dict.fromkeys(sizes, float("inf")) for a in ALGORITHMS + ["gloo"]}
    for _ in range(rounds):
        local = launch(_time_minidist, world_size, args=(sizes, ALGORITHMS, iters))
        gloo = launch(_time_gloo, world_size, args=(sizes, iters), backend="torch")
        for n in sizes:
            for a in ALGORITHMS:
                best[a][n] = min(best[a][n], max(r[0][a][n] for r in local))
            best["gloo"][n] = min(best["gloo"][n], max(r[n] for r in gloo))
    rows, bus = [], 2 * (world_size - 1) / world_size
    for algo, by_size in best.items():
        for n in sizes:
            t = by_size[n]
            rows.append({"world_size": world_size, "algorithm": algo, "bytes": n,
                         "time_us": t * 1e6, "algbw_GBps": n / t / 1e9,
                         "busbw_GBps": n / t / 1e9 * bus, "vs_gloo": best["gloo"][n] / t})
    return rows, local[0][1]


def fit_path(path: str, p: int, sizes, seconds) -> tuple[float, float]:
    """The constants of ``path``'s cost formula, t = messages alpha + bytes / beta
    (``costs.terms``), least squares on relative error; returns (alpha s, beta bytes/s).
    alpha is clipped at 0: a slightly negative fit means "too small to see"."""
    terms = [costs.terms(path, n, p)[:2] for n in sizes]
    alpha, beta = fit_relative(terms, seconds)
    return max(alpha, 0.0), beta


def main(args) -> dict:
    quick = args.quick or quick_mode()
    sizes = [n for n in (QUICK_SIZES if quick else SIZES)
             if args.max_size is None or n <= args.max_size]
    rows, fits, model, picks = [], {}, {}, {}
    for p in [int(w) for w in args.world_sizes.split(",")]:
        prow, picks[p] = measure(p, sizes, quick)
        rows += prow
        print(f"\nall_reduce, world size {p}, float32, median per call (slowest rank, best "
              f"of {1 if quick else ROUNDS} rounds)\n")
        print(format_table(prow, [("algorithm", "algorithm", "s"), ("bytes", "size", "bytes"),
                                  ("time_us", "time us", ".1f"),
                                  ("algbw_GBps", "algbw GB/s", ".3f"),
                                  ("busbw_GBps", "busbw GB/s", ".3f"),
                                  ("vs_gloo", "x gloo", ".2f")]))
        print("auto picks: " + ", ".join(f"{n} B: {a}" for n, a in picks[p].items()))
        secs = {a: [r["time_us"] * 1e-6 for r in prow if r["algorithm"] == a]
                for a in ALGORITHMS + ["gloo"]}
        fits[p] = {a: fit_alpha_beta(sizes, ts) for a, ts in secs.items()}
        model[p] = {a: fit_path(a, p, sizes, ts) for a, ts in secs.items()
                    if a in costs.ALL_REDUCE_PATHS}
    _print_fits(fits, model)
    _print_goals(rows)
    result = {"rows": rows, "auto_picks": picks, "sizes": sizes,
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "model": MODEL,
              "call_fits": {p: {a: {"alpha_us": al * 1e6, "beta_GBps": be / 1e9}
                                for a, (al, be) in f.items()} for p, f in fits.items()},
              "fit": {p: {a: {"alpha": al, "beta": be} for a, (al, be) in f.items()}
                      for p, f in model.items()}}
    return save_outputs(args, result, lambda path: plot(rows, path))


def _print_fits(fits, model) -> None:
    print("\nfit of the whole call, t(n) = alpha + n / beta:\n")
    for p, f in fits.items():
        print(f"p={p}: " + ", ".join(f"{a} ({al * 1e6:.1f} us, {be / 1e9:.3f} GB/s)"
                                     for a, (al, be) in f.items()))
    print("\nfit of each path's cost formula, costs.time(path, n, p, alpha, beta), alpha per "
          "message, beta per link (the \"fit\" that auto loads from --json):\n")
    rows = [{"p": p, "path": a, "alpha_us": al * 1e6, "beta_GBps": be / 1e9}
            for p, f in model.items() for a, (al, be) in f.items()]
    print(format_table(rows, [("p", "p", "d"), ("path", "path", "s"),
                              ("alpha_us", "alpha us", ".2f"), ("beta_GBps", "beta GB/s", ".3f")]))
    print("use it: MINIDIST_COSTS=<the --json file>, or md.collectives.auto.load_costs(path)")


def _print_goals(rows) -> None:
    """The issue's two goals, read off this run."""
    for p in sorted({r["world_size"] for r in rows}):
        auto = [r for r in rows if r["world_size"] == p and r["algorithm"] == "auto"]
        worst = min(auto, key=lambda r: r["vs_gloo"])
        print(f"p={p}: auto vs gloo, worst size {worst['bytes']} B: {worst['vs_gloo']:.2f}x "
              f"({'never slower' if worst['vs_gloo'] >= 1 else 'SLOWER than gloo there'})")
    big = [r for r in rows if r["world_size"] == 2 and r["bytes"] == 16 << 20]
    if big:
        gloo = next(r for r in big if r["algorithm"] == "gloo")
        best = max((r for r in big if r["algorithm"] != "gloo"), key=lambda r: r["busbw_GBps"])
        print(f"16 MiB, p=2: best minidist {best['algorithm']} busbw "
              f"{best['busbw_GBps']:.2f} GB/s, gloo {gloo['busbw_GBps']:.2f} GB/s "
              f"({best['busbw_GBps'] / gloo['busbw_GBps']:.2f}x)")


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    worlds = sorted({r["world_size"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4.5), squeeze=False)
    for ax, p in zip(axes[0], worlds):
        for algo in dict.fromkeys(r["algorithm"] for r in rows):
            pts = [r for r in rows if r["world_size"] == p and r["algorithm"] == algo]
            style = "k--" if algo == "gloo" else "o-"
            ax.semilogx([r["bytes"] for r in pts], [r["busbw_GBps"] for r in pts], style,
                        label=algo, markersize=3)
        ax.set(xlabel="bytes per rank", ylabel="bus bandwidth (GB/s)",
               title=f"all_reduce, {p} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)
