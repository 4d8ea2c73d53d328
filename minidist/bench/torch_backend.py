"""``minidist bench torch-backend``: torch's own DDP over the minidist backend against
torch's DDP over gloo.

The same program (``torch.nn.parallel.DistributedDataParallel`` around an MLP, SGD, a
fixed batch of ``--batch`` samples per rank: weak scaling) runs twice per world size, in
one run and interleaved over ``--rounds``:

* ``over minidist``: ``md.torch_backend.init_process_group(comm)`` inside ``md.launch``:
  every bucket's all-reduce is minidist's (the local backend's shared-memory path where it
  is faster), started on the group's thread while backward goes on (overlap on);
* ``over gloo``: the process group ``md.launch(..., backend="torch")`` makes.

Both use torch DDP's defaults (25 MiB buckets, ``gradient_as_bucket_view=False``) unless
``--bucket-cap-mb`` says otherwise. Reported per world size from the best round (all
rounds are in the JSON): milliseconds and steps per second (median step of the slowest
rank), the communication share 1 - t(step under ``no_sync()``) / t(step), and the
speed-up of minidist over gloo. The issue's goal: at least 1.0x at 2 and 4 ranks.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..launch import launch
from ..models import mlp
from ..notebook import quick_mode
from .timing import (
    add_common_arguments,
    best_of_rounds,
    format_table,
    pyplot,
    save_outputs,
)

VARIANTS = ("over minidist", "over gloo")
FULL = {"width": 1024, "depth": 5, "steps": 30, "world_sizes": (2, 4), "rounds": 3}
QUICK = {"width": 256, "depth": 3, "steps": 6, "world_sizes": (2,), "rounds": 1}


def add_arguments(parser) -> None:
    add_common_arguments(parser, "a small model, few steps (CI)")
    parser.add_argument("--world-sizes", metavar="LIST", help="comma-separated, e.g. 2,4")
    parser.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="torch DDP's cap")


def _run_rank(comm, variant: str, cfg: dict) -> dict:
    """Time synchronising steps and, on the same DDP, steps under ``no_sync()``."""
    if variant == "over minidist":
        from .. import torch_backend

        torch_backend.init_process_group(comm)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(mlp(cfg["width"], cfg["depth"]),
                                              bucket_cap_mb=cfg["cap"])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(cfg["batch"], cfg["width"], generator=g)
    y = torch.randint(0, 10, (cfg["batch"],), generator=g)
    sync, local = [], []
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
    del ddp, opt  # DDP goes before its process group: freed after it, gloo's can hang
    dist.destroy_process_group()
    return {"step_s": statistics.median(sync), "local_s": statistics.median(local)}


def measure(variant: str, world_size: int, cfg: dict) -> dict:
    backend = "torch" if variant == "over gloo" else "local"
    ranks = launch(_run_rank, world_size, args=(variant, cfg), backend=backend, timeout=300)
    return dict(max(ranks, key=lambda r: r["step_s"]))  # a step is as slow as its slowest rank


def run_all(cfg: dict, world_sizes, rounds: int) -> list[dict]:
    """Every (world size, variant) ``rounds`` times, interleaved; each row its best round."""
    cases = [({"world_size": p, "variant": v}, partial(measure, v, p, cfg))
             for p in world_sizes for v in VARIANTS]
    return derive(best_of_rounds(cases, rounds))


def derive(rows: list[dict]) -> list[dict]:
    by = {(r["world_size"], r["variant"]): r for r in rows}
    for r in rows:
        r["ms"] = r["step_s"] * 1e3
        r["steps_per_s"] = 1 / r["step_s"]
        r["comm_share"] = max(0.0, 1 - r["local_s"] / r["step_s"])
        gloo = by.get((r["world_size"], "over gloo"))
        r["vs_gloo"] = gloo["step_s"] / r["step_s"] if gloo else None
    return rows


COLUMNS = [("world_size", "ranks", "d"), ("variant", "torch DDP", "s"), ("ms", "ms/step", ".1f"),
           ("steps_per_s", "steps/s", ".1f"), ("comm_share", "comm share", ".0%"),
           ("vs_gloo", "vs gloo", ".2f")]


def main(args) -> dict:
    preset = QUICK if args.quick or quick_mode() else FULL
    world_sizes = ([int(w) for w in args.world_sizes.split(",")] if args.world_sizes
                   else list(preset["world_sizes"]))
    cfg = {"width": preset["width"], "depth": preset["depth"], "steps": preset["steps"],
           "batch": args.batch, "cap": args.bucket_cap_mb}
    n_params = sum(p.numel() for p in mlp(cfg["width"], cfg["depth"]).parameters())
    print(f"torch DDP on an MLP {cfg['depth']} x {cfg['width']} ({n_params / 1e6:.2f} M "
          f"parameters), batch {cfg['batch']} per rank, bucket cap {cfg['cap']:g} MiB, one "
          "torch thread per rank\n")
    rows = run_all(cfg, world_sizes, args.rounds or preset["rounds"])
    print(format_table(rows, COLUMNS))
    print("\ncomm share: 1 - t(step under no_sync) / t(step)")
    for r in rows:
        if r["variant"] == "over minidist":
            print(f"{r['world_size']} ranks: torch DDP over minidist ran {r['vs_gloo']:.2f}x "
                  "the steps/s of torch DDP over gloo (goal: at least 1.0x)")
    result = {"config": dict(cfg, parameters=n_params), "rows": rows}
    return save_outputs(args, result, lambda path: plot(rows, path))


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    sizes = sorted({r["world_size"] for r in rows})
    by = {(r["world_size"], r["variant"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, variant in enumerate(VARIANTS):
        xs = [i + (k - 0.5) * 0.4 for i in range(len(sizes))]
        ax.bar(xs, [by[p, variant]["steps_per_s"] for p in sizes], 0.4, label=variant)
    ax.set_xticks(range(len(sizes)), [f"{p} ranks" for p in sizes])
    ax.set(ylabel="steps/s", title="torch DDP: minidist backend vs gloo (higher is better)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
