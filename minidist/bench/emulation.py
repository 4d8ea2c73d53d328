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
   whose workers' pushes meet on its port at one virtual instant and book it in the
   order they reach it on the wall clock: its median step is shown).

3. **Load** (virtual time). One program (8 ranks, or 4 with ``--quick``: matrix products
   then a ring all-reduce, three times) alone and beside two processes that keep both
   cores busy, with CPU-time compute and with the FLOP model: the virtual time each gives,
   and loaded / alone. The FLOP model's ratio is exactly 1; the CPU-time clock's is what
   this machine's load does to the CPU time of the same work (caches, memory bandwidth,
   frequency), a reading of this machine, not of the model.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F

from ..collectives import all_reduce
from ..launch import launch
from ..models import mlp
from ..notebook import quick_mode
from ..parallel.data import DistributedDataParallel
from ..transports.compute import Compute
from ..transports.network import Link, Network
from .emulation_scenarios import fidelity
from .timing import add_common_arguments, best_of_rounds, format_table, save_outputs

VARIANTS = ("local", "virtual, CPU time", "virtual, FLOPs")
LINK = Link(alpha=10e-6, bandwidth=10e9, name="10 GB/s")
FULL = {"width": 512, "steps": 20, "world_sizes": (2, 4, 8), "rounds": 5}
QUICK = {"width": 128, "steps": 4, "world_sizes": (2, 4), "rounds": 1}
LOAD_RANKS = {"full": 8, "quick": 4}


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


def _busy(comm, chunks: int) -> float:
    """Six products of a 96 x 96 matrix, then a ring all-reduce, ``chunks`` times: the
    virtual seconds it takes on this rank."""
    a = torch.randn(96, 96, generator=torch.Generator().manual_seed(comm.rank)) / 10
    comm.barrier()
    start = comm.now()
    for _ in range(chunks):
        for _ in range(6):
            a = torch.tanh(a @ a)
        all_reduce(comm, a, algorithm="ring")
    return comm.now() - start


@contextmanager
def _cpu_hogs(n: int):
    """``n`` processes that spin on a core each, for the duration of the block."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def load(world_size: int, chunks: int = 3) -> list[dict]:
    """The slowest rank's virtual time of ``_busy``, alone and beside two CPU hogs, with
    CPU-time compute and with the FLOP model (module docstring, part 3)."""
    rows = []
    for variant, compute in (("CPU time", None), ("FLOPs", Compute(flops=1e12, efficiency=1))):
        net = Network.uniform(LINK, compute=compute)
        run = partial(launch, _busy, world_size, args=(chunks,), network=net, clock="virtual")
        alone = max(run())
        with _cpu_hogs(2):
            loaded = max(run())
        rows.append({"variant": variant, "ranks": world_size, "alone_ms": alone * 1e3,
                     "loaded_ms": loaded * 1e3, "ratio": loaded / alone})
    return rows


LOAD_COLUMNS = [("variant", "compute", "s"), ("ranks", "ranks", "d"),
                ("alone_ms", "alone (virtual ms)", ".4f"),
                ("loaded_ms", "beside 2 hogs", ".4f"), ("ratio", "loaded / alone", ".3f")]
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
    ranks = LOAD_RANKS["quick" if quick else "full"]
    print(f"\n3. Load: the same program on {ranks} ranks alone and beside two CPU-hogging "
          "processes (virtual time)\n")
    loaded = load(ranks)
    print(format_table(loaded, LOAD_COLUMNS))
    result = {"config": dict(cfg, link=repr(LINK)), "cost": rows, "fidelity": fid,
              "load": loaded}
    return save_outputs(args, result)
