"""``minidist bench emulation``: what virtual time costs, and how faithful it is.

1. **Cost** (wall clock). The same program, a DDP step of an MLP (``--width``, 4 layers,
   batch 32 per rank, 25 MiB buckets, ring all-reduce: ``auto`` would take the local
   backend's shared-memory path, which the emulated network does not offer), on 2, 4 and
   8 ranks:

   * ``local``: the bare local backend, no network;
   * ``virtual, CPU time``: ``md.launch(..., network=net, clock="virtual")``, computation
     charged as each thread's CPU time (nothing intercepted: bookkeeping only);
   * ``virtual, FLOPs``: the same with ``md.Compute`` on the network: a Python dispatch
     mode counts every op's FLOPs (``transports/compute.py``), a few µs per op.

   Each rank times its steps on the wall clock (median of the slowest rank); the variants
   run interleaved, ``--rounds`` times, best round each (``timing.best_of_rounds``). The
   ratio to ``local`` is what virtual time adds; the goal is at most 1.3x. (The
   wall-clock emulated network is not a row: it sleeps for every modelled message, so its
   cost is the modelled time itself.)

2. **Fidelity** (virtual time). Every scenario of ``emulation_scenarios.py`` against its
   formula from ``md.costmodel``: ping-pong, ring all-reduce, a flat ring over two nodes,
   incast, a straggler, DDP's overlap, a synchronous parameter server, a 1F1B bubble, on
   2, 4 and 8 ranks. Virtual times do not depend on this machine: run it anywhere, loaded
   or not, and the right half of the table is the same (except the parameter server's,
   which answers messages in the order they reach it on the wall clock: its median step
   is shown, which load moves only when it overtakes most requests).
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from ..launch import launch
from ..models import mlp
from ..parallel.data import DistributedDataParallel
from ..transports.compute import Compute
from ..transports.network import Link, Network
from .emulation_scenarios import fidelity
from .timing import add_common_arguments, best_of_rounds, format_table, quick_mode, save_outputs

VARIANTS = ("local", "virtual, CPU time", "virtual, FLOPs")
LINK = Link(alpha=10e-6, bandwidth=10e9, name="10 GB/s")
FULL = {"width": 512, "steps": 20, "world_sizes": (2, 4, 8), "rounds": 5}
QUICK = {"width": 128, "steps": 4, "world_sizes": (2, 4), "rounds": 1}


def add_arguments(parser) -> None:
    add_common_arguments(parser, "a small model, 2 and 4 ranks, one round (CI)",
                         plot_help=None)
    parser.add_argument("--world-sizes", metavar="LIST", help="comma-separated, e.g. 2,4,8")
    parser.add_argument("--width", type=int, help="the MLP's width (cost table)")


def _steps(comm, cfg: dict) -> dict:
    """Wall-clock seconds of each DDP step on this rank (never ``comm.now()``: this table
    is about what the emulation costs here)."""
    torch.manual_seed(0)
    model = mlp(cfg["width"], 4)
    ddp = DistributedDataParallel(model, comm, algorithm="ring")  # the same on every row
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(32, cfg["width"], generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    times = []
    for _ in range(cfg["steps"] + 1):  # the first step warms up
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return {"step_s": statistics.median(times[1:])}


def measure(variant: str, world_size: int, cfg: dict) -> dict:
    kwargs = {}
    if variant != "local":
        compute = Compute(flops=1e12, efficiency=1.0) if variant.endswith("FLOPs") else None
        kwargs = {"network": Network.uniform(LINK, compute=compute), "clock": "virtual"}
    ranks = launch(_steps, world_size, args=(cfg,), timeout=300, **kwargs)
    return dict(max(ranks, key=lambda r: r["step_s"]))


def cost(cfg: dict, world_sizes, rounds: int) -> list[dict]:
    """Every (world size, variant), interleaved, best of ``rounds``; the ratio to local."""
    cases = [({"world_size": p, "variant": v}, partial(measure, v, p, cfg))
             for p in world_sizes for v in VARIANTS]
    rows = best_of_rounds(cases, rounds)
    local = {r["world_size"]: r["step_s"] for r in rows if r["variant"] == "local"}
    for r in rows:
        r["ms"] = r["step_s"] * 1e3
        r["vs_local"] = r["step_s"] / local[r["world_size"]]
    return rows


COST_COLUMNS = [("world_size", "ranks", "d"), ("variant", "clock", "s"),
                ("ms", "wall ms/step", ".2f"), ("vs_local", "x local", ".2f")]
FIDELITY_COLUMNS = [("scenario", "scenario", "s"), ("ranks", "ranks", "d"),
                    ("formula", "formula", "s"), ("unit", "unit", "s"),
                    ("predicted", "predicted", ".4g"), ("virtual", "virtual", ".4g"),
                    ("ratio", "virtual / predicted", ".3f")]


def main(args) -> dict:
    quick = args.quick or quick_mode()
    preset = QUICK if quick else FULL
    world_sizes = ([int(w) for w in args.world_sizes.split(",")] if args.world_sizes
                   else list(preset["world_sizes"]))
    cfg = {"width": args.width or preset["width"], "steps": preset["steps"]}
    print(f"1. The cost of virtual time (wall clock): a DDP step of an MLP 4 x {cfg['width']}, "
          f"batch 32 per rank, one torch thread per rank\n")
    rows = cost(cfg, world_sizes, args.rounds or preset["rounds"])
    print(format_table(rows, COST_COLUMNS))
    worst = max(r["vs_local"] for r in rows if r["variant"] == "virtual, CPU time")
    print(f"\nvirtual time (CPU-time compute) costs at most {worst:.2f}x the bare local "
          "backend here (goal: 1.3x)\n")
    print("2. Fidelity (virtual time, FLOP-model compute): predicted by md.costmodel, then "
          f"run on {LINK}\n")
    fid = fidelity(world_sizes)
    print(format_table(fid, FIDELITY_COLUMNS))
    result = {"config": dict(cfg, link=repr(LINK)), "cost": rows, "fidelity": fid}
    return save_outputs(args, result)
