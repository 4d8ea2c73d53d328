"""``minidist bench ps``: sync parameter server (1 and S servers) vs ring DDP and torch's RPC PS.

Three tables from one run:

1. **This machine**, steps/s as workers grow (weak scaling: ``--batch`` samples per worker),
   for the same MLP and SGD step under five systems and a floor: ``md.ParameterServer`` in
   sync mode with one server and with ``--servers`` servers (W workers plus S server
   processes; the ranks share this machine's memory, so the shards and gradients skip the
   wire, ``parallel/param_server/shared_shards.py``), the 1-server PS again with
   ``shared_memory=False`` (every push and pull a message through the local transport's
   rings: the naive version), ``md.DistributedDataParallel`` with ring all_reduce (W
   ranks), and PyTorch's RPC parameter server as in its batch-update tutorial
   (``torch.distributed.rpc``, TensorPipe,
   ``parallel/param_server/torch_rpc.py``: a ``BatchUpdateParameterServer`` on rank 0 behind
   an ``RRef``; each trainer ``rpc_sync``-calls ``update_and_fetch_model`` with its
   gradients, which answers once all W gradients are in and the optimizer has stepped).
   A last row is no parameter server at all: the lock-step floor (``_floor_rank``), W
   workers doing only what every sync PS's workers must (forward, backward, the two
   copies, a barrier per step): how fast these cores allow any of them to go.
   Rounds alternate between the systems;
   each row is its best round (median step of the slowest worker).
2. **The emulated network** (``md.Network.uniform``, ``transports/emulated.py``): the same
   minidist rows over a 10 Gb/s link per rank (30 µs), then over 1 Gb/s (50 µs), with the
   step time the cost model predicts (the measured compute time plus
   ``ps_step_time(pipelined=True)`` or ``ring_step_time``, ``costmodel/ps.py``, ``costmodel/dp.py``)
   and the bytes into each server per step, measured from the server's report against
   W*N/S. At 10 Gb/s a 4 MB model's wire time is a few ms, no more than what W+S processes
   sharing this machine's cores cost, so the figures mix both; at 1 Gb/s the wire dominates
   and the server's ingress shows as the bottleneck, with sharding relieving it. torch RPC
   talks real TCP and has no row here.
3. **A straggler**: least squares with W workers, one of them ``--straggler`` seconds slower
   per step; seconds until the workers' mean loss falls below 1e-3 of its start, for
   sync, ssp (s=2) and async.

Quick mode (``--quick``, or CI=true) shrinks everything to a few seconds.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from ..costmodel.dp import ring_step_time
from ..costmodel.ps import ps_step_time
from ..faults import slow_rank
from ..launch import launch
from ..models import mlp
from ..parallel.data import DistributedDataParallel
from ..parallel.param_server import ParameterServer, torch_rpc
from ..transports.network import Link, Network
from .spec import Bench, add_speed, option, slowest
from .timing import best_of_rounds, format_table, pyplot, save_figure, save_outputs

FULL = {"width": 512, "depth": 4, "batch": 32, "steps": 15, "workers": (1, 2, 4),
        "rounds": 3, "lsq_steps": 120}
QUICK = {"width": 64, "depth": 2, "batch": 8, "steps": 3, "workers": (1, 2), "rounds": 1,
         "lsq_steps": 15}
TEN_GBE = Link(alpha=30e-6, bandwidth=1.25e9, name="10 GbE")
ONE_GBE = Link(alpha=50e-6, bandwidth=0.125e9, name="1 GbE")
WARMUP = 2
MESSAGES = ", messages"  # the row of the PS with shared memory turned off
FLOOR = "lock-step floor"  # W workers, their copies, no server (_floor_rank)
SLICE = 100_000  # elements: the 512x512 weights are sliced across servers, as MXNet would


OPTIONS = (option("--servers", type=int, default=2, help="servers of the sharded PS"),
           option("--straggler", type=float, default=0.01,
                  help="seconds the slow worker sleeps per step (table 3)"))


def _batch(rank: int, cfg: dict):
    g = torch.Generator().manual_seed(rank)
    return (torch.randn(cfg["batch"], cfg["width"], generator=g),
            torch.randint(0, 10, (cfg["batch"],), generator=g))


def _timed_loop(cfg: dict, rank: int, model, before, after) -> dict:
    """``before(); forward; backward; after()`` per step; median step and compute times."""
    x, y = _batch(rank, cfg)
    steps, computes = [], []
    for _ in range(cfg["steps"] + WARMUP):
        start = time.perf_counter()
        before()
        t0 = time.perf_counter()
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        t1 = time.perf_counter()
        after()
        steps.append(time.perf_counter() - start)
        computes.append(t1 - t0)
    return {"step_s": statistics.median(steps[WARMUP:]),
            "compute_s": statistics.median(computes[WARMUP:])}


def _ps_rank(comm, servers: int, cfg: dict, shared: bool | None) -> dict:
    model = mlp(cfg["width"], cfg["depth"], seed=0)
    ps = ParameterServer(comm, model, num_servers=servers, lr=1e-3, slice_threshold=SLICE,
                         shared_memory=shared)
    if ps.is_server:
        report = ps.serve()
        return {"server": True, "bytes_in": report.bytes_in, "updates": report.updates}
    out = _timed_loop(cfg, comm.rank, model, ps.pull, ps.push)
    ps.pull()
    ps.close()
    return out


def _ddp_rank(comm, cfg: dict) -> dict:
    ddp = DistributedDataParallel(mlp(cfg["width"], cfg["depth"], seed=0), comm,
                                  algorithm="ring")
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    return _timed_loop(cfg, comm.rank, ddp, lambda: None, opt.step)


def _floor_rank(comm, cfg: dict) -> dict:
    """What W workers in lock step cost on this machine with no server at all: a barrier,
    the parameters copied in, forward, backward, the gradient copied out: the two copies
    every parameter server whose workers keep their own model make. No sync PS can beat
    it on these cores; how far the PS rows sit above it is what the server costs."""
    model = mlp(cfg["width"], cfg["depth"], seed=0)
    params = list(model.parameters())
    shard = torch.cat([p.detach().reshape(-1) for p in params])
    slot = torch.empty_like(shard)

    def pull() -> None:
        comm.barrier()
        with torch.no_grad():
            for p, v in zip(params, shard.split([p.numel() for p in params])):
                p.copy_(v.view_as(p))

    def push() -> None:
        torch.cat([p.grad.reshape(-1) for p in params], out=slot)

    return _timed_loop(cfg, comm.rank, model, pull, push)


def _rpc_train(cfg: dict, client, rank: int) -> dict:
    """A trainer of torch's RPC PS: forward, backward, then one ``update_and_fetch_model``
    round trip (the push and the pull of the step)."""
    return _timed_loop(cfg, rank, client.model, lambda: None, client.update_and_fetch)


# -- measuring ------------------------------------------------------------------------------
def measure(system: str, workers: int, cfg: dict, network: Network | None = None) -> dict:
    """One run of ``system`` with ``workers`` workers: the slowest worker's figures."""
    if system == "torch RPC PS":
        make = partial(mlp, cfg["width"], cfg["depth"], seed=0)
        ranks = launch(torch_rpc.run, workers + 1, timeout=120,
                       args=(torch_rpc.free_port(), make, partial(_rpc_train, cfg)))[0]
    elif system == "ring DDP":
        ranks = list(launch(_ddp_rank, workers, args=(cfg,), network=network, timeout=120))
    elif system == FLOOR:
        ranks = list(launch(_floor_rank, workers, args=(cfg,), timeout=120))
    else:
        s = int(system.split()[1])  # "PS 1 server", "PS 2 servers", "PS 1 server, messages"
        shared = False if system.endswith(MESSAGES) else None
        out = launch(_ps_rank, workers + s, args=(s, cfg, shared), network=network,
                     timeout=120)
        cfg_in = max(r["bytes_in"] for r in out if "server" in r)
        return dict(slowest(r for r in out if "server" not in r),
                    server_in_per_step=cfg_in / (cfg["steps"] + WARMUP))
    return slowest(ranks)


def _cases(cfg: dict, systems: tuple, network: Network | None) -> list[tuple[dict, partial]]:
    return [({"workers": w, "system": system}, partial(measure, system, w, cfg, network))
            for w in cfg["workers"] for system in systems]


def _speeds(rows: list[dict]) -> list[dict]:
    for r in map(add_speed, rows):
        r["compute_ms"] = r["compute_s"] * 1e3
    return rows


def sweep(cfg: dict, systems: tuple, network: Network | None, rounds: int) -> list[dict]:
    """Every (workers, system) ``rounds`` times, interleaved; each row is its best round."""
    return _speeds(best_of_rounds(_cases(cfg, systems, network), rounds))


def predict(rows: list[dict], cfg: dict, link: Link) -> None:
    """Add the cost model's step time and the predicted server ingress W*N/S to the
    emulated-network rows. Step = a worker's forward and backward (measured on the PS rows
    of the same W, where backward does no communication) + ``ps_step_time(pipelined=True)``
    or ``ring_step_time``."""
    compute = {}
    for r in rows:
        if r["system"].startswith("PS"):
            compute[r["workers"]] = min(compute.get(r["workers"], 1e9), r["compute_ms"])
    for r in rows:
        w, n = r["workers"], cfg["model_bytes"]
        if r["system"] == "ring DDP":
            comm_s = ring_step_time(w, n, link.bandwidth, link.alpha) if w > 1 else 0.0
        else:
            s = int(r["system"].split()[1])
            comm_s = ps_step_time(w, n, s, link.bandwidth, link.alpha, pipelined=True)
            r["predicted_in"] = w * n / s
        r["predicted_ms"] = compute[w] + comm_s * 1e3


def ratios(rows: list[dict], reference: str) -> None:
    by = {(r["workers"], r["system"]): r for r in rows}
    for r in rows:
        ref = by.get((r["workers"], reference))
        r["vs_ref"] = r["steps_per_s"] / ref["steps_per_s"] if ref else None


# -- a straggler: time to a target loss, sync vs ssp vs async -------------------------------
LSQ_DIM, LSQ_ROWS, LSQ_LR = 10, 64, 0.1
MODES = (("sync", 0), ("ssp", 2), ("async", 0))


def _lsq_rank(comm, mode: str, staleness: int, steps: int, slow_s: float):
    """Noise-free least squares (each worker's rows determine the optimum); worker rank 1
    sleeps ``slow_s`` per step. Workers return (time, loss at the pulled parameters)."""
    g = torch.Generator().manual_seed(0)
    w_star = torch.randn(LSQ_DIM, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(LSQ_DIM, 1, bias=False)
    ps = ParameterServer(comm, model, mode=mode, staleness=staleness, lr=LSQ_LR)
    if ps.is_server:
        return ps.serve()
    x = torch.randn(LSQ_ROWS, LSQ_DIM, generator=torch.Generator().manual_seed(comm.rank))
    y, trace = x @ w_star, []
    with slow_rank(comm, rank=1, seconds=slow_s):
        for _ in range(steps):
            ps.pull()
            model.zero_grad()
            loss = F.mse_loss(model(x), y)
            trace.append((time.perf_counter(), loss.item()))
            loss.backward()
            ps.push()
    ps.close()
    return trace


def time_to_target(traces: list[list[tuple]], fraction: float = 1e-3) -> tuple[float | None,
                                                                                float]:
    """Seconds from the first step until the mean of the workers' latest losses falls to
    ``fraction`` of its value once every worker has reported (None: never); and that mean
    at the end of the run."""
    events = sorted((t, w, loss) for w, tr in enumerate(traces) for t, loss in tr)
    start, latest, initial, reached = events[0][0], {}, None, None
    for t, w, loss in events:
        latest[w] = loss
        if len(latest) < len(traces):
            continue
        mean = sum(latest.values()) / len(latest)
        initial = mean if initial is None else initial
        if reached is None and mean <= fraction * initial:
            reached = t - start
    return reached, sum(latest.values()) / len(latest)


def straggler(cfg: dict, workers: int, slow_s: float) -> list[dict]:
    rows = []
    for mode, s in MODES:
        out = launch(_lsq_rank, workers + 1, args=(mode, s, cfg["lsq_steps"], slow_s),
                     timeout=120)
        server, traces = out[0], list(out[1:])
        seconds, final = time_to_target(traces)
        label = f"{mode} (s={s})" if mode == "ssp" else mode
        rows.append({"mode": label, "to_target_s": seconds, "final_loss": final,
                     "updates": server.updates, "mean_staleness":
                     statistics.mean(server.staleness), "max_staleness": max(server.staleness),
                     "histogram": server.staleness_histogram()})
    return rows


# -- the command ----------------------------------------------------------------------------
def systems(servers: int, rpc_row: bool) -> tuple[str, ...]:
    """On this machine (``rpc_row``) the sync PS shares memory (``shared_shards.py``); its
    message path is shown beside it. On the emulated network only messages exist."""
    names = ("PS 1 server", f"PS {servers} servers", "ring DDP")
    if not rpc_row:
        return names
    return ("PS 1 server", "PS 1 server" + MESSAGES) + names[1:] + ("torch RPC PS", FLOOR)

COLUMNS = [("workers", "workers", "d"), ("system", "system", "s"), ("ms", "ms/step", ".1f"),
           ("steps_per_s", "steps/s", ".1f"), ("compute_ms", "compute ms", ".1f")]


def _configure(preset: dict, args) -> dict:
    return dict(preset, servers=args.servers, model_bytes=4 * _params(preset))


def _params(cfg: dict) -> int:
    return sum(p.numel() for p in mlp(cfg["width"], cfg["depth"]).parameters())


def _header(cfg: dict) -> str:
    return (f"MLP {cfg['depth']} x {cfg['width']} ({_params(cfg) / 1e6:.2f} M parameters, "
            f"{cfg['model_bytes'] / 1e6:.1f} MB), batch {cfg['batch']} per worker, SGD; "
            f"sharded PS: {cfg['servers']} servers; one torch thread per rank\n")


def _here(rows: list[dict], cfg: dict) -> list[dict]:
    ratios(_speeds(rows), "torch RPC PS")
    return rows


# Table 1 as a spec: this machine, every system; tables 2 and 3 are the main's own.
SPEC = Bench(
    quick_help="a small model, few steps (CI)", full=FULL, quick=QUICK,
    lists={"workers": "1,2,4"}, options=OPTIONS, configure=_configure,
    cases=lambda cfg: _cases(cfg, systems(cfg["servers"], True), None), derive=_here,
    columns=COLUMNS + [("vs_ref", "vs torch RPC", ".2f")], header=_header)
add_arguments = SPEC.add_arguments


def _emulated(cfg: dict, rounds: int) -> list[dict]:
    """Table 2: the minidist systems on each emulated link, predicted beside measured."""
    emulated = []
    for link in (TEN_GBE, ONE_GBE):
        rows = sweep(cfg, systems(cfg["servers"], False), Network.uniform(link), rounds)
        predict(rows, cfg, link)
        ratios(rows, "ring DDP")
        emulated += [dict(r, link=link.name) for r in rows]
        print(f"\n2. emulated network: {link} per rank")
        print(format_table(rows, COLUMNS + [
            ("predicted_ms", "predicted ms", ".1f"),
            ("server_in_per_step", "server in/step", "bytes"),
            ("predicted_in", "W*N/S", "bytes"), ("vs_ref", "vs ring", ".2f")]))
    return emulated


def main(args) -> dict:
    cfg = SPEC.config(args)
    print(SPEC.header(cfg))
    local = SPEC.run(cfg)
    print("1. this machine (shared memory; ranks share its cores)")
    print(format_table(local, SPEC.columns))
    emulated = _emulated(cfg, min(cfg["rounds"], 2))
    w = max(cfg["workers"][-1], 2)
    slow = straggler(cfg, w, args.straggler)
    print(f"\n3. least squares, {w} workers, worker rank 1 {args.straggler * 1e3:g} ms slower "
          "per step: seconds until the mean loss is 1e-3 of its start")
    print(format_table(slow, [("mode", "mode", "s"), ("to_target_s", "to target s", ".2f"),
                              ("final_loss", "loss at end", ".2e"), ("updates", "updates", "d"),
                              ("mean_staleness", "mean staleness", ".2f"),
                              ("max_staleness", "max staleness", "d")]))
    by = {(r["workers"], r["system"]): r for r in local}
    for n in cfg["workers"]:
        if n > 1 and (n, "PS 1 server") in by:
            print(f"{n} workers: minidist 1-server sync PS = {by[n, 'PS 1 server']['vs_ref']:.2f}x "
                  f"the steps/s of torch's RPC parameter server (the lock-step floor, no "
                  f"server at all: {by[n, FLOOR]['vs_ref']:.2f}x)")
    result = {"config": cfg, "local": local, "emulated": emulated, "straggler": slow,
              "links": [repr(TEN_GBE), repr(ONE_GBE)]}
    return save_outputs(args, result, partial(plot, result))


def plot(result: dict, path: str) -> None:
    plt = pyplot()
    links = list(dict.fromkeys(r["link"] for r in result["emulated"]))
    panels = [("This machine (shared memory)", result["local"])] + [
        (f"Emulated network ({name} per rank)", [r for r in result["emulated"]
                                                 if r["link"] == name]) for name in links]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
    for ax, (title, rows) in zip(axes, panels):
        for system in dict.fromkeys(r["system"] for r in rows):
            mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["workers"])
            line, = ax.plot([r["workers"] for r in mine], [r["ms"] for r in mine], "o-",
                            label=system)
            if "predicted_ms" in mine[0]:
                ax.plot([r["workers"] for r in mine], [r["predicted_ms"] for r in mine], "--",
                        color=line.get_color(), label=f"{system}, predicted")
        ax.set(xlabel="workers", ylabel="ms per step (lower is better)", title=title)
        ax.set_xticks(sorted({r["workers"] for r in rows}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path)
