"""``minidist bench ddp``: minidist DDP (overlap on and off) against torch DDP on gloo.

The same model, data and training step (SGD on an MLP, a fixed batch of ``--batch`` samples
per rank: weak scaling) run under three wrappers, at world sizes 1, 2 and 4, in one run:

* ``minidist overlap``: ``md.DistributedDataParallel(overlap=True)``, local backend;
* ``minidist after``: the same with ``overlap=False`` (buckets reduced after backward);
* ``minidist naive``: ``md.DataParallelNaive``, one blocking all-reduce per gradient;
* ``torch DDP``: ``torch.nn.parallel.DistributedDataParallel`` on a gloo process group.

Both DDPs use the same bucket cap (torch's default, 25 MiB, unless ``--bucket-cap-mb``) and
copy gradients into buckets and back (``gradient_as_bucket_view=False``, both defaults;
``--bucket-view`` sets it to True on both, which saves that copy).

Reported per wrapper and world size, from the best of ``--rounds`` interleaved runs (all
rounds are in the JSON): milliseconds and steps per second (median step of the slowest
rank); the *communication share*, 1 - t(step under ``no_sync()``) / t(step), i.e. the
part of the step that gradient averaging adds and backward does not hide, measured the same
way for every wrapper; for minidist also the time its bucket all-reduces took and the time
backward waited for them; *scaling efficiency* t(1 rank) / t(p ranks) (weak scaling: 1.0 is
perfect); and the speed-up over torch DDP. On a machine with fewer cores than ranks, ranks
share cores, so efficiency there measures oversubscription as much as communication.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..launch import launch
from ..models import mlp
from ..parallel.data import DataParallelNaive, DistributedDataParallel
from .spec import Bench, add_speed, option, slowest, speedup
from .timing import pyplot, save_figure

VARIANTS = ("minidist overlap", "minidist after", "minidist naive", "torch DDP")
FULL = {"width": 1024, "depth": 5, "steps": 30, "world_sizes": (1, 2, 4), "rounds": 5}
QUICK = {"width": 256, "depth": 3, "steps": 6, "world_sizes": (1, 2), "rounds": 1}
OPTIONS = (option("--batch", type=int, default=16, help="samples per rank per step"),
           option("--bucket-cap-mb", type=float, default=25.0, help="both DDPs"),
           option("--bucket-view", action="store_true",
                  help="gradient_as_bucket_view=True on both DDPs"))

make_mlp = mlp  # the lesson's name for it


def _wrap(comm, variant: str, model: nn.Module, cfg: dict) -> nn.Module:
    common = {"bucket_cap_mb": cfg["cap"], "gradient_as_bucket_view": cfg["view"]}
    if variant == "torch DDP":
        return nn.parallel.DistributedDataParallel(model, **common)
    if variant == "minidist naive":
        return DataParallelNaive(model, comm)
    return DistributedDataParallel(model, comm, overlap=variant == "minidist overlap", **common)


def _run_rank(comm, variant: str, cfg: dict) -> dict:
    """Time synchronizing steps and, on the same wrapper, steps under ``no_sync()``."""
    torch.manual_seed(0)
    ddp = _wrap(comm, variant, make_mlp(cfg["width"], cfg["depth"]), cfg)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(cfg["batch"], cfg["width"], generator=g)
    y = torch.randint(0, 10, (cfg["batch"],), generator=g)
    sync, local, comm_s, wait_s = [], [], [], []
    for i in range(cfg["steps"] + 3):  # alternate, so both see the same machine load
        for times, quiet in ((sync, False), (local, True)):
            start = time.perf_counter()
            opt.zero_grad()
            if quiet:
                with ddp.no_sync():
                    F.cross_entropy(ddp(x), y).backward()
            else:
                F.cross_entropy(ddp(x), y).backward()
            opt.step()
            if i >= 3:  # warm-up steps are not counted
                times.append(time.perf_counter() - start)
                if not quiet and hasattr(ddp, "last_sync"):
                    comm_s.append(ddp.last_sync["comm_s"])
                    wait_s.append(ddp.last_sync["wait_s"])
    med = statistics.median
    return {"step_s": med(sync), "local_s": med(local),
            "comm_s": med(comm_s) if comm_s else None, "wait_s": med(wait_s) if wait_s else None}


def measure(variant: str, world_size: int, cfg: dict) -> dict:
    backend = "torch" if variant == "torch DDP" else "local"
    return slowest(launch(_run_rank, world_size, args=(variant, cfg), backend=backend))


def derive(rows: list[dict], cfg: dict | None = None) -> list[dict]:
    """Add steps/s, communication share, scaling efficiency and speed-up over torch DDP."""
    by = {(r["world_size"], r["variant"]): r for r in rows}
    for r in map(add_speed, rows):
        r["comm_share"] = max(0.0, 1 - r["local_s"] / r["step_s"])
        r["allreduce_ms"] = None if r["comm_s"] is None else r["comm_s"] * 1e3
        r["wait_ms"] = None if r["wait_s"] is None else r["wait_s"] * 1e3
        r["efficiency"] = speedup(r, by.get((1, r["variant"])))
        r["vs_torch"] = speedup(r, by.get((r["world_size"], "torch DDP")))
    return rows


COLUMNS = [("world_size", "ranks", "d"), ("variant", "wrapper", "s"), ("ms", "ms/step", ".1f"),
           ("steps_per_s", "steps/s", ".1f"), ("comm_share", "comm share", ".0%"),
           ("allreduce_ms", "all-reduce ms", ".1f"), ("wait_ms", "exposed ms", ".1f"),
           ("efficiency", "scaling eff.", ".2f"), ("vs_torch", "vs torch", ".2f")]


def _configure(preset: dict, args) -> dict:
    return dict(preset, batch=args.batch, cap=args.bucket_cap_mb, view=args.bucket_view)


def _parameters(cfg: dict) -> int:
    return sum(p.numel() for p in make_mlp(cfg["width"], cfg["depth"]).parameters())


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    sizes = sorted({r["world_size"] for r in rows})
    by = {(r["world_size"], r["variant"]): r for r in rows}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(VARIANTS)
    for k, variant in enumerate(VARIANTS):
        xs = [i + (k - (len(VARIANTS) - 1) / 2) * width for i in range(len(sizes))]
        ax1.bar(xs, [by[p, variant]["steps_per_s"] for p in sizes], width, label=variant)
        ax2.bar(xs, [100 * by[p, variant]["comm_share"] for p in sizes], width, label=variant)
    for ax, label, title in ((ax1, "steps/s", "Training speed (higher is better)"),
                             (ax2, "% of the step", "Communication not hidden")):
        ax.set_xticks(range(len(sizes)), [f"{p} rank{'s' if p > 1 else ''}" for p in sizes])
        ax.set(ylabel=label, title=title)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path)


SPEC = Bench(
    quick_help="a small model, few steps (CI)", full=FULL, quick=QUICK,
    lists={"world_sizes": "1,2,4"}, options=OPTIONS, configure=_configure,
    variants=VARIANTS, measure=measure, derive=derive, columns=COLUMNS,
    header="MLP {depth} x {width} ({millions:.2f} M parameters), batch {batch} per rank, "
           "bucket cap {cap:g} MiB, gradient_as_bucket_view={view}, one torch thread per "
           "rank\n",
    notes="comm share: 1 - t(step under no_sync) / t(step), the same measure for every "
          "wrapper;\nexposed: how long backward waited for minidist's buckets at its end",
    summary=(lambda r: r["world_size"] == 2 and r["variant"] != "torch DDP",
             "world size 2, {variant}: {vs_torch:.2f}x the steps/s of torch DDP"),
    parameters=_parameters, plot=plot)
add_arguments, main = SPEC.add_arguments, SPEC.main
