"""The compression half of ``minidist bench comm``: fewer bytes (fp16, top-k, PowerSGD) or
fewer synchronisations (local SGD), against torch's DDP comm hooks, on the small GPT.

One run trains the same GPT (``md.models.GPT`` on ``CharText``, AdamW, the same seed and
data on every row) for a few steps per method, on 2 ranks (``--ddp-world-size``):

* minidist DDP (``md.DistributedDataParallel``) with no hook, ``fp16_hook``,
  ``TopK(--ddp-topk-ratio)``, ``PowerSGD(rank=2)``, and ``md.LocalSGD(period=--ddp-period)``;
  each twice: on this machine (local backend: shared memory) and on an emulated network
  (``md.Network.uniform(md.Link(--ddp-latency, --ddp-bandwidth))``, 1 GbE by default), where
  the bytes saved show in the step time as they would between machines;
* torch DDP on gloo (this machine only) with no hook, ``fp16_compress_hook`` and
  ``powerSGD_hook`` (rank 2), and with minidist's ``PowerSGD`` registered through
  ``compression.torch_hook`` ("minidist PowerSGD"): the same DDP around both PowerSGDs, so
  the two rows differ only in the hook.

Per row, best of ``--ddp-rounds`` interleaved rounds (``timing.best_of_rounds``), over the
steps after the ``WARMUP`` plain ones (PowerSGD and local SGD, torch's too, start after
them; with the default step counts the window is a whole number of local-SGD periods): ms
per step (the mean step of the slowest rank: local SGD's steps differ by design); bytes
rank 0 sent per step (minidist: counted by ``comm.stats``; torch: gloo does not count, so
the formula: ``compression.dense_bytes`` / ``powersgd_bytes``, marked ``formula``); bytes
against no compression; the loss after N steps (mean of the last 3 steps over the ranks);
the hook's own relative error ||C(x) - x|| / ||x|| where it reports one.

Goal (issue 16): PowerSGD rank 2 moves at most a tenth of the bytes of no compression on
the small GPT.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
from torch import nn

from ..checks import positive_int
from ..compression import PowerSGD, TopK, dense_bytes, fp16_hook, powersgd_bytes, torch_hook
from ..launch import launch
from ..models import GPT, CharText, lm_loss
from ..notebook import quick_mode
from ..parallel.data import DistributedDataParallel, LocalSGD
from ..transports.network import Link, Network
from .timing import best_of_rounds, format_table, gpt_config

MINIDIST = ("none", "fp16", "top-k", "PowerSGD", "local SGD")
TORCH = ("none", "fp16", "PowerSGD", "minidist PowerSGD")
WARMUP = 2  # plain steps before PowerSGD / local SGD start (torch's minimum is 2), untimed
FULL = {"n_embd": 128, "n_layer": 2, "block": 64, "batch": 8, "steps": 30, "rounds": 3}
QUICK = {"n_embd": 32, "n_layer": 1, "block": 16, "batch": 4, "steps": 6, "rounds": 1}


def add_arguments(parser) -> None:
    parser.add_argument("--ddp-world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--ddp-steps", type=int, help="training steps per method")
    parser.add_argument("--ddp-rounds", type=int,
                        help="repeat each run, report the best (default: --rounds)")
    parser.add_argument("--ddp-topk-ratio", type=float, default=0.01,
                        help="share of entries top-k sends (default 0.01)")
    parser.add_argument("--ddp-period", type=int, default=4,
                        help="local SGD: average the parameters every this many steps")
    parser.add_argument("--ddp-bandwidth", type=float, default=0.125, metavar="GB/s",
                        help="emulated link bandwidth (default 0.125: 1 GbE)")
    parser.add_argument("--ddp-latency", type=float, default=50e-6, metavar="S",
                        help="emulated link latency in seconds (default 50e-6)")


def _minidist_wrapper(comm, method: str, model: nn.Module, cfg: dict):
    """(the model to call, what to do after optimizer.step(), the hook or None)."""
    if method == "local SGD":
        local = LocalSGD(model, comm, period=cfg["period"], warmup_steps=WARMUP)
        return local, local.step, None
    hook = {"none": None, "fp16": fp16_hook, "top-k": TopK(cfg["topk_ratio"]),
            "PowerSGD": PowerSGD(rank=2, start_iter=WARMUP)}[method]
    return DistributedDataParallel(model, comm, comm_hook=hook), (lambda: None), hook


def _torch_wrapper(comm, method: str, model: nn.Module, cfg: dict):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    # bucket_cap_mb given explicitly: one 25 MiB bucket, as minidist's. With torch's default
    # 1 MiB first bucket the model has two, and powerSGD_hook on gloo then aborted with a
    # collective size mismatch in our runs (presumably the two buckets' chained all_reduces
    # were issued in different orders on the two ranks).
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    if method == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method == "PowerSGD":
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=2,
                                            start_powerSGD_iter=WARMUP)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif method == "minidist PowerSGD":
        hook = PowerSGD(rank=2, start_iter=WARMUP)
        ddp.register_comm_hook(comm, torch_hook(hook))
        return ddp, (lambda: None), hook
    return ddp, (lambda: None), None


def _run_rank(comm, impl: str, method: str, cfg: dict) -> dict:
    torch.manual_seed(0)
    model = GPT(gpt_config(cfg, tie_weights=True))
    wrap = _minidist_wrapper if impl == "minidist" else _torch_wrapper
    ddp, after_step, hook = wrap(comm, method, model, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = CharText().batches(cfg["steps"], cfg["batch"], cfg["block"], seed=comm.rank)
    times, losses, sent = [], [], 0
    for i, (x, y) in enumerate(data):
        if i == WARMUP:
            sent = comm.stats.bytes_sent
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits, _ = ddp(x)
        loss = lm_loss(logits, y)
        loss.backward()
        opt.step()
        after_step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    window = times[WARMUP:]  # whole local-SGD periods: the mean, not the median
    return {"step_s": statistics.fmean(window), "sent": (comm.stats.bytes_sent - sent)
            / len(window), "loss": losses[-3:],
            "report": hook.report() if hasattr(hook, "report") else None}


def run_case(impl: str, method: str, network: str, cfg: dict) -> dict:
    """One launch: every rank trains; the row is the slowest rank's step and rank 0's bytes."""
    net = None
    if network == "emulated":
        net = Network.uniform(Link(alpha=cfg["latency"], bandwidth=cfg["bandwidth"] * 1e9,
                                   name="emulated"))
    backend = "torch" if impl == "torch" else "local"
    ranks = launch(_run_rank, cfg["world_size"], args=(impl, method, cfg), backend=backend,
                   network=net, timeout=300)
    losses = [v for r in ranks for v in r["loss"]]
    return {"step_s": max(r["step_s"] for r in ranks), "sent": ranks[0]["sent"],
            "loss": sum(losses) / len(losses), "report": ranks[0]["report"]}


def torch_bytes(method: str, model: nn.Module, world_size: int) -> float:
    """What torch's hooks send per step by the formulas (gloo counts nothing): a ring
    all_reduce of every gradient in float32 (none), float16 (fp16), or of PowerSGD's
    (m + n) r elements per matrix and the uncompressed rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    if method in ("PowerSGD", "minidist PowerSGD"):
        return powersgd_bytes([p.shape for p in params], 2, 2, 4, world_size)
    return dense_bytes(n, 2 if method == "fp16" else 4, world_size)


def _config(args) -> dict:
    quick = bool(getattr(args, "quick", False)) or quick_mode()
    preset = dict(QUICK if quick else FULL)
    if args.ddp_steps:
        preset["steps"] = args.ddp_steps
    preset["steps"] = max(preset["steps"], WARMUP + 1)
    if not 0 < args.ddp_topk_ratio <= 1:
        raise ValueError(f"--ddp-topk-ratio must be in (0, 1], got {args.ddp_topk_ratio}")
    for name in ("ddp_world_size", "ddp_period"):
        positive_int(getattr(args, name), "--" + name.replace("_", "-"))
    return dict(preset, quick=quick, world_size=args.ddp_world_size,
                rounds=args.ddp_rounds or getattr(args, "rounds", None) or preset["rounds"],
                topk_ratio=args.ddp_topk_ratio,
                period=args.ddp_period, bandwidth=args.ddp_bandwidth, latency=args.ddp_latency)


def _cases(cfg: dict) -> list[tuple[dict, object]]:
    link = f"emulated {cfg['bandwidth'] * 8:g} Gbit/s"
    cases = [({"impl": "minidist", "method": m, "network": net, "label": label},
              partial(run_case, "minidist", m, net, cfg))
             for net, label in (("local", "this machine"), ("emulated", link))
             for m in MINIDIST]
    cases += [({"impl": "torch", "method": m, "network": "local", "label": "this machine"},
               partial(run_case, "torch", m, "local", cfg)) for m in TORCH]
    return cases


def derive(rows: list[dict], cfg: dict) -> list[dict]:
    """Add ms, bytes per step (torch: formula), bytes against no compression, error."""
    model = GPT(gpt_config(cfg, tie_weights=True))
    for r in rows:
        r["ms"] = r["step_s"] * 1e3
        r["bytes_source"] = "comm.stats" if r["impl"] == "minidist" else "formula"
        if r["impl"] == "torch" and r["report"]:  # minidist's hook under torch DDP
            r["sent"], r["bytes_source"] = r["report"]["bytes_sent"], "hook report"
        elif r["impl"] == "torch":
            r["sent"] = torch_bytes(r["method"], model, cfg["world_size"])
        r["rel_error"] = (r["report"] or {}).get("relative_error")
    base = {(r["impl"], r["network"]): r for r in rows if r["method"] == "none"}
    for r in rows:
        none = base[r["impl"], r["network"]]
        r["bytes_vs_none"] = r["sent"] / none["sent"] if none["sent"] else None
        r["speedup_vs_none"] = none["step_s"] / r["step_s"]
    return rows


COLUMNS = [("label", "network", "s"), ("impl", "impl", "s"), ("method", "method", "s"),
           ("ms", "ms/step", ".1f"), ("speedup_vs_none", "vs none", ".2f"),
           ("sent", "bytes/step", ",.0f"), ("bytes_source", "counted by", "s"),
           ("bytes_vs_none", "bytes vs none", ".3f"), ("loss", "loss", ".3f"),
           ("rel_error", "hook error", ".2f")]


def measure(args) -> dict:
    """Run every case, print the table and the goal; return the JSON-able result."""
    cfg = _config(args)
    n_params = GPT(gpt_config(cfg, tie_weights=True)).num_params()
    print(f"GPT {cfg['n_layer']} layers x {cfg['n_embd']} ({n_params / 1e6:.2f} M parameters),"
          f" {cfg['world_size']} ranks, batch {cfg['batch']} x {cfg['block']} per rank, "
          f"{cfg['steps']} steps, top-k ratio {cfg['topk_ratio']:g}, local SGD period "
          f"{cfg['period']}, PowerSGD/local SGD after {WARMUP} plain steps\n")
    rows = derive(best_of_rounds(_cases(cfg), cfg["rounds"]), cfg)
    print(format_table(rows, COLUMNS))
    psgd = next(r for r in rows if r["impl"] == "minidist" and r["method"] == "PowerSGD"
                and r["network"] == "local")
    goal = {"powersgd_bytes_vs_none": psgd["bytes_vs_none"],
            "met": psgd["bytes_vs_none"] is not None and psgd["bytes_vs_none"] <= 0.1}
    print(f"\nGoal: PowerSGD rank 2 sends {psgd['bytes_vs_none']:.3f} x the bytes of no "
          f"compression (at most 0.1: {'met' if goal['met'] else 'NOT met'}). torch rows run "
          "on gloo on this machine; their bytes are the formula.")
    if cfg["quick"]:
        print("Quick mode: a tiny GPT, whose 1-D tensors (sent uncompressed) are a larger share "
              "of its bytes than in the full run's.")
    for r in rows:
        r.pop("report", None)
    return {"config": dict(cfg, parameters=n_params), "rows": rows, "goal": goal}


def plot(result: dict, axes) -> None:
    """axes[0]: loss after N steps against bytes per step; axes[1]: ms per step."""
    from matplotlib.ticker import NullFormatter

    ax1, ax2 = axes
    markers = {"none": "o", "fp16": "s", "top-k": "^", "PowerSGD": "D", "local SGD": "v",
               "minidist PowerSGD": "P"}
    rows = [r for r in result["rows"] if r["network"] == "local"]
    for r in rows:  # torch hollow and larger, so that a point minidist shares stays visible
        ours = r["impl"] == "minidist"
        ax1.scatter(max(r["sent"], 1), r["loss"], marker=markers[r["method"]],
                    s=40 if ours else 110, facecolors="C0" if ours else "none",
                    edgecolors="C0" if ours else "C1", label=f"{r['impl']} {r['method']}")
    ax1.set(xscale="log", xlabel="bytes sent per step by rank 0 (log scale)",
            ylabel=f"loss after {result['config']['steps']} steps",
            title="Loss against bytes (this machine)")
    ax1.xaxis.set_minor_formatter(NullFormatter())
    ax1.legend(fontsize="x-small")
    labels = list(dict.fromkeys(r["label"] for r in result["rows"]))
    names = list(dict.fromkeys((r["impl"], r["method"]) for r in result["rows"]))
    width = 0.8 / len(labels)
    by = {(r["impl"], r["method"], r["label"]): r for r in result["rows"]}
    for k, label in enumerate(labels):
        xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(names))]
        ms = [by[n + (label,)]["ms"] if n + (label,) in by else 0 for n in names]
        ax2.bar(xs, ms, width, label=label)
    ax2.set_xticks(range(len(names)), [f"{i}\n{m}" for i, m in names], fontsize="x-small")
    ax2.set(ylabel="ms per step", title="Step time (slowest rank; torch: this machine only)")
    ax2.legend(fontsize="small")
