"""``minidist bench costmodel``: md.costmodel's prediction vs measured DDP, ZeRO, PP, TP steps.

Measured (this machine, one run): the small GPT (``md.models.GPT``, float32, AdamW, untied
head) trained by ``parallel.hybrid.HybridGPT`` with ring all-reduces, one strategy per row:

* ``alone``: p ranks that each train their own copy on 1/p of the batch and never talk
  (p = 1: plain training): the calibration of the compute rate at p ranks;
* ``DDP``: dp = p (one coalesced gradient all-reduce per step);
* ``ZeRO-1``, ``ZeRO-3``: dp = p through ``md.ZeRO``;
* ``pipeline 1F1B``: pp = p, micro-batches of one sequence;
* ``tensor parallel``: tp = p (Megatron's column/row split, vocabulary-parallel head).

Predicted (``md.costmodel.predict``) with constants fitted on this machine, never per
strategy: the compute rate X_p per rank = model FLOPs of an ``alone`` rank's step (72 B s l
h^2 (1 + s/6h + V/12lh), fp32) / its measured time, so that what p busy ranks do to each
other on these cores (and whatever else runs here) is in X_p; messages alpha + n / beta
with the ring's (alpha, beta) that ``minidist bench collectives`` fitted
(``collectives/default_costs.json``, nearest world size). ``--emulated`` adds the rows
again on an emulated 25 GbE network, predicted with that link in series with this
machine's.

Reported per row: measured and predicted ms per step, their ratio (predicted / measured,
reported and never asserted; 1 by construction for ``alone``), the predicted split
(compute, tp, pp, bubble, dp), and the model state per rank (parameters, gradients, Adam)
measured and predicted. What the model leaves out shows in the ratios: element-wise work
and Python overhead that do not shrink with p, the optimizer step every dp rank repeats in
full, waiting that is not in alpha-beta, and uneven pipeline stages (the embedding and the
head are whole layers of HybridGPT's split, not of the model's l / pp).
"""

from __future__ import annotations

import math
import os
from functools import partial

import torch

from ..collectives.auto import costs_table
from ..costmodel import Cluster, GPTShape, Plan, model_flops, predict
from ..launch import launch
from ..models import synthetic_tokens
from ..parallel.hybrid import HybridGPT
from ..parallel.mesh import DeviceMesh
from ..transports.network import Link, Network
from .spec import Bench, option
from .timing import gpt_config, median_time, pyplot, save_figure

ALONE = "alone"
CASES = (("DDP", ("p", 1, 1), None), ("ZeRO-1", ("p", 1, 1), 1),
         ("ZeRO-3", ("p", 1, 1), 3), ("pipeline 1F1B", (1, "p", 1), None),
         ("tensor parallel", (1, 1, "p"), None))
FULL = {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab": 256, "block": 64, "batch": 8,
        "steps": 5, "world_sizes": (2, 4), "rounds": 3}
QUICK = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab": 64, "block": 16, "batch": 4,
         "steps": 2, "world_sizes": (2,), "rounds": 1}
EMULATED = Link.ethernet_25g()


OPTIONS = (option("--emulated", action="store_true",
                  help="also run every row on an emulated 25 GbE network"),)


def plan_for(layout: tuple[int, int, int], zero: int | None, batch: int) -> Plan:
    """The cost model's plan for what HybridGPT runs: micro-batches of one sequence when
    pipelined, the replica's whole batch otherwise; fp32, no recomputation; every tp rank
    sends its stage's whole activation (no scatter/gather)."""
    dp, pp, tp = layout
    m, b = (batch // dp, 1) if pp > 1 else (1, batch // dp)
    return Plan(dp, pp, tp, m, b, zero or 0, "fp32", scatter_gather=False)


def _rank(comm, layout, cfg: dict, zero: int | None, alone: bool = False) -> dict:
    """One rank's median step; ``alone``: a 1-rank mesh of its own on batch / world."""
    batch = cfg["batch"] // comm.world_size if alone else cfg["batch"]
    mesh = DeviceMesh(comm.split(comm.rank) if alone else comm,
                      dict(zip(("dp", "pp", "tp"), layout)))
    plan = plan_for(layout, zero, batch)
    model = HybridGPT(gpt_config(cfg), mesh, plan.microbatches, zero_stage=zero,
                      optimizer_class=torch.optim.AdamW, algorithm="ring", lr=1e-3)
    x, y = synthetic_tokens(1, batch, cfg["block"], cfg["vocab"], seed=comm.rank)[0]
    step_s = median_time(lambda: model.step(x, y), cfg["steps"], warmup=1)
    return {"step_s": step_s, "state_bytes": model.memory()["total"]}


def measure(layout, zero: int | None, cfg: dict, emulated: bool = False,
            alone_ranks: int = 0) -> dict:
    """Slowest rank's step and largest state; ``alone_ranks``: that many 1-rank copies."""
    world = alone_ranks or layout[0] * layout[1] * layout[2]
    network = Network.uniform(EMULATED) if emulated else None
    ranks = launch(_rank, world, args=(layout, cfg, zero, bool(alone_ranks)),
                   network=network, timeout=300)
    return {"step_s": max(r["step_s"] for r in ranks),  # a step is its slowest rank's
            "state_bytes": max(r["state_bytes"] for r in ranks)}


def _cases(world_sizes, emulated: bool) -> list[tuple[dict, tuple, int | None, bool]]:
    out = []
    for p in sorted({1, *world_sizes}):
        out.append(({"strategy": ALONE, "world": p, "network": "this machine"}, (1, 1, 1),
                    None, False))
        for name, shape, zero in CASES if p > 1 else ():
            layout = tuple(p if d == "p" else d for d in shape)
            for emu in (False, True) if emulated else (False,):
                net = "25 GbE (emulated)" if emu else "this machine"
                out.append(({"strategy": name, "world": p, "network": net}, layout, zero, emu))
    return out


def _measured(cfg: dict) -> list[tuple[dict, partial]]:
    return [(dict(fields, layout="x".join(map(str, layout)), zero=zero),
             partial(measure, layout, zero, cfg, emu,
                     fields["world"] if fields["strategy"] == ALONE else 0))
            for fields, layout, zero, emu in _cases(cfg["world_sizes"], cfg["emulated"])]


def machine_cluster(world: int, flops_per_rank: float, emulated: bool) -> Cluster:
    """This machine as a cluster of ``world`` ranks: the fitted ring alpha and beta of the
    nearest measured world size, in series with the emulated link if any."""
    table = costs_table()
    alpha, beta = table[min(table, key=lambda q: abs(math.log2(q / world)))]["ring"]
    if emulated:
        alpha, beta = alpha + EMULATED.alpha, 1 / (1 / beta + 1 / EMULATED.bandwidth)
    return Cluster.this_machine(world, flops_per_rank, alpha, beta)


def add_predictions(rows: list[dict], cfg: dict) -> dict[int, float]:
    """Predict every row with the rate its world size's ``alone`` row measured; returns
    {world size: FLOP/s per rank}."""
    shape = GPTShape.from_config(gpt_config(cfg))
    rates = {r["world"]: model_flops(shape, cfg["batch"] // r["world"]) / r["step_s"]
             for r in rows if r["strategy"] == ALONE}
    for r in rows:
        layout = tuple(int(v) for v in r["layout"].split("x"))
        alone = r["strategy"] == ALONE  # one rank of world size p, at p's rate
        batch = cfg["batch"] // r["world"] if alone else cfg["batch"]
        cluster = machine_cluster(1 if alone else r["world"], rates[r["world"]],
                                  r["network"] != "this machine")
        pred = predict(shape, cluster, plan_for(layout, r["zero"], batch))
        state = sum(pred.memory[k] for k in ("params", "grads", "optimizer"))
        r.update({k.replace("_s", "_ms"): v * 1e3 for k, v in pred.times.items()})
        r.update(measured_ms=r["step_s"] * 1e3, predicted_ms=pred.step_s * 1e3,
                 ratio=pred.step_s / r["step_s"], predicted_state_bytes=state,
                 state_ratio=state / r["state_bytes"], gflops_per_rank=rates[r["world"]] / 1e9)
    return rates


COLUMNS = [("world", "ranks", "d"), ("strategy", "strategy", "s"), ("layout", "dp x pp x tp", "s"),
           ("network", "network", "s"), ("measured_ms", "measured ms", ".1f"),
           ("predicted_ms", "predicted ms", ".1f"), ("ratio", "pred/meas", ".2f"),
           ("compute_ms", "compute", ".1f"), ("tp_ms", "tp", ".1f"), ("pp_ms", "pp", ".1f"),
           ("bubble_ms", "bubble", ".1f"), ("dp_ms", "dp", ".1f"),
           ("state_bytes", "state/rank", "bytes"), ("state_ratio", "state pred/meas", ".2f")]


def _derive(rows: list[dict], cfg: dict) -> list[dict]:
    add_predictions(rows, cfg)
    return rows


def _rates(rows: list[dict]) -> dict[int, float]:
    """GFLOP/s per rank of each world size, as its ``alone`` row measured."""
    return {r["world"]: r["gflops_per_rank"] for r in rows if r["strategy"] == ALONE}


def _header(cfg: dict) -> str:
    shape = GPTShape.from_config(gpt_config(cfg))
    return (f"Measured here: GPT {cfg['n_layer']} layers x {cfg['n_embd']} "
            f"({shape.params / 1e6:.2f} M parameters), batch {cfg['batch']} x {cfg['block']} "
            f"tokens, AdamW, float32, ring all-reduces, one torch thread per rank, "
            f"{os.cpu_count()} cores\n")


def _notes(rows: list[dict], cfg: dict) -> str:
    fitted = ", ".join(f"{p} ranks {x:.1f}" for p, x in _rates(rows).items())
    return (f"Predicted by md.costmodel with X_p = GFLOP/s per rank measured by the 'alone' "
            f"rows ({fitted}; those rows are the calibration, ratio 1\nby construction) and the "
            "ring's alpha/beta from collectives/default_costs.json; pred/meas is reported, "
            "never asserted. state: parameters,\ngradients and Adam state of the largest rank "
            "(predicted: 16 B x Psi / (pp tp), ZeRO dividing by dp).")


def _result(rows: list[dict], cfg: dict) -> dict:
    params = GPTShape.from_config(gpt_config(cfg)).params
    return {"config": dict(cfg, parameters=params), "rows": rows,
            "gflops_per_rank": _rates(rows)}


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    labels = [(f"alone, {r['world']} ranks" if r["strategy"] == ALONE else
               f"{r['strategy']} {r['layout']}") + (" 25GbE" if r["network"] != "this machine"
                                                   else "") for r in rows]
    xs = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 6))
    ax1.bar([x - 0.2 for x in xs], [r["measured_ms"] for r in rows], 0.4, label="measured")
    ax1.bar([x + 0.2 for x in xs], [r["predicted_ms"] for r in rows], 0.4,
            label="predicted (md.costmodel)")
    ax1.set(ylabel="ms per step", title="Step time: measured here vs predicted")
    ax2.bar(xs, [r["ratio"] for r in rows], 0.6, color="C2", label="predicted / measured")
    ax2.axhline(1.0, color="0.3", linestyle="--", label="exact prediction")
    ax2.set(ylabel="predicted / measured", title="Ratio per strategy (1 = exact)")
    for ax in (ax1, ax2):
        ax.set_xticks(list(xs), labels, rotation=70, ha="right", fontsize="small")
        ax.set_xlabel("strategy, layout dp x pp x tp (25GbE: on the emulated network)")
        ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


SPEC = Bench(
    quick_help="a small model, few steps (CI)", full=FULL, quick=QUICK,
    lists={"world_sizes": "2,4"}, options=OPTIONS,
    configure=lambda preset, args: dict(preset, emulated=args.emulated),
    cases=_measured, derive=_derive, columns=COLUMNS, header=_header, notes=_notes,
    result=_result, plot=plot)
add_arguments, main = SPEC.add_arguments, SPEC.main
