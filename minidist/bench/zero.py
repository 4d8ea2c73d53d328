"""``minidist bench zero``: ZeRO stages 0-3, minidist against torch's counterparts on gloo.

The same GPT (``md.models.GPT``, float32, tied head), AdamW, a fixed batch of ``--batch``
sequences per rank (weak scaling), at 2 and 4 ranks, in one run:

* ``minidist stage k`` (k = 0..3): ``md.ZeRO(model, comm, stage=k)``, local backend;
* stage 0's counterpart ``torch DDP``: ``nn.parallel.DistributedDataParallel`` + AdamW;
* stage 1's ``torch ZeroRedundancyOptimizer``: DDP + ``torch.distributed.optim.
  ZeroRedundancyOptimizer(optimizer_class=AdamW)`` (whole tensors per rank, broadcasts);
* stage 2's ``torch fully_shard(reshard_after_forward=False)``: FSDP2 keeping the gathered
  parameters from forward to backward (FSDP's SHARD_GRAD_OP, its ZeRO-2);
* stage 3's ``torch fully_shard``: FSDP2, each block a unit, then the root;
* ``minidist stage 3, prefetch``: ``md.ZeRO(..., stage=3, prefetch=True)``, the next unit
  gathered on a communication thread while the current one computes;
* with ``--emulated``, ``minidist stage k, 25 GbE (emulated)``: minidist on the emulated
  network (every pair of ranks on a 25 GbE link), where stage 3's 1.5x traffic shows;
  beside it the alpha-beta prediction (``costmodel.zero.zero_step_time``).

Reported per row, best of ``--rounds`` interleaved runs (all rounds in the JSON): ms and
steps/s (median step of the slowest rank); the model-state bytes rank 0 holds between steps
(after ``step``, before ``zero_grad``), measured from the tensors held: parameters,
gradients, optimizer state (torch's DTensors by their local shard; DDP's bucket buffers are
not visible and not counted); ZeRO's prediction (``costmodel.zero.zero_rank_bytes``); bytes a
rank sends per step (``comm.stats``; minidist only, gloo's traffic is invisible) against
``zero_step_bytes``; minidist's peak parameter bytes during the step (stage 3: shards,
root and the gathered unit); speed and memory against the torch counterpart of the same stage. FSDP2
frees gathered parameters after backward even without resharding after forward, so between
steps its stage-2 row holds what stage 3 holds; minidist's stage 2 keeps full parameters,
as ZeRO-2 does. Machines with fewer cores than ranks share them, which inflates every
multi-rank time.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
from torch import nn

from ..costmodel.zero import zero_rank_bytes, zero_step_bytes, zero_step_time
from ..launch import launch
from ..models import GPT, GPTConfig, synthetic_tokens
from ..parallel.zero import ZeRO
from ..parallel.zero.flat_shards import storage_bytes
from ..transports.network import Link, Network
from .spec import Bench, add_speed, option, speedup
from .timing import local_shard, pyplot, save_figure

TORCH = {0: "torch DDP", 1: "torch ZeroRedundancyOptimizer",
         2: "torch fully_shard (no reshard)", 3: "torch fully_shard"}
EMULATED = "25 GbE (emulated)"
PREFETCH = "minidist stage 3, prefetch"
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
FULL = {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "block_size": 64,
        "batch": 8, "steps": 10, "world_sizes": (2, 4), "rounds": 3}
QUICK = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64, "block_size": 16,
         "batch": 2, "steps": 3, "world_sizes": (2,), "rounds": 1}
WARMUP = 2


OPTIONS = (option("--emulated", action="store_true",
                  help="also run minidist stages 1-3 on an emulated 25 GbE network"),)


def variants(emulated: bool) -> list[tuple[int, str]]:
    rows = [(s, name) for s in range(4) for name in (f"minidist stage {s}", TORCH[s])]
    rows.insert(7, (3, PREFETCH))
    return rows + ([(s, f"minidist stage {s}, {EMULATED}") for s in (1, 2, 3)] if emulated
                   else [])


def _model(cfg: dict) -> GPT:
    return GPT(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS}))


def _wrap_torch(stage: int, model: GPT, lr: float):
    """(module to call, optimizer, its state dict) for torch's counterpart of ``stage``."""
    if stage <= 1:
        ddp = nn.parallel.DistributedDataParallel(model)
        if stage == 0:
            opt = torch.optim.AdamW(ddp.parameters(), lr=lr)
            return ddp, opt, opt.state
        from torch.distributed.optim import ZeroRedundancyOptimizer
        zro = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=lr)
        return ddp, zro, zro.optim.state
    from torch.distributed.fsdp import fully_shard
    for block in model.transformer.h:
        fully_shard(block, reshard_after_forward=stage == 3)
    fully_shard(model, reshard_after_forward=stage == 3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, opt, opt.state


def _torch_memory(model: nn.Module, state) -> dict:
    params = [local_shard(p) for p in model.parameters()]
    grads = [local_shard(p.grad) for p in model.parameters() if p.grad is not None]
    st = [local_shard(v) for s in state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    out = {"params": storage_bytes(params), "grads": storage_bytes(grads),
           "optimizer": storage_bytes(st)}
    return dict(out, total=sum(out.values()))


def _run_rank(comm, stage: int, variant: str, cfg: dict) -> dict:
    model = _model(cfg)
    data = synthetic_tokens(1, cfg["batch"], cfg["block_size"], cfg["vocab_size"],
                            seed=comm.rank)
    x, y = data[0]
    ours = variant.startswith("minidist")
    if ours:
        z = ZeRO(model, comm, stage=stage, optimizer_class=torch.optim.AdamW, lr=1e-3,
                 prefetch=variant == PREFETCH)
        module, opt, state = z, z, None
    else:
        module, opt, state = _wrap_torch(stage, model, 1e-3)
    times, sent = [], []
    for i in range(cfg["steps"] + WARMUP):
        start, before = time.perf_counter(), comm.stats.bytes_sent
        opt.zero_grad()
        module(x, y)[1].backward()
        peak = z.memory()["params_peak"] if ours else None  # step resets it
        opt.step()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
            sent.append(comm.stats.bytes_sent - before)
    memory = z.memory() if ours else _torch_memory(model, state)
    formula = z.predicted_step_bytes() if ours else \
        zero_step_bytes([model.num_params()], comm.world_size, stage, 4)
    return {"step_s": statistics.median(times), "memory": memory, "params_peak": peak,
            "bytes": statistics.median(sent) if ours else None, "formula_bytes": formula}


def measure(stage: int, variant: str, p: int, cfg: dict) -> dict:
    backend = "local" if variant.startswith("minidist") else "torch"
    network = Network.uniform(Link.ethernet_25g()) if variant.endswith(EMULATED) else None
    ranks = launch(_run_rank, p, args=(stage, variant, cfg), backend=backend, network=network,
                   timeout=300)
    slowest = max(ranks, key=lambda r: r["step_s"])  # a step is as slow as its slowest rank
    return dict(slowest, memory=ranks[0]["memory"], bytes=ranks[0]["bytes"])


def _cases(cfg: dict) -> list[tuple[dict, partial]]:
    return [({"world_size": p, "stage": stage, "variant": variant},
             partial(measure, stage, variant, p, cfg))
            for p in cfg["world_sizes"] for stage, variant in variants(cfg.get("emulated"))]


def run_all(cfg: dict, world_sizes, rounds: int, emulated: bool) -> list[dict]:
    """Every (world size, variant) ``rounds`` times, interleaved; each row its best round."""
    return SPEC.run(dict(cfg, world_sizes=world_sizes, rounds=rounds, emulated=emulated))


def derive(rows: list[dict], cfg: dict) -> list[dict]:
    """Add ms, steps/s, memory in KiB, the prediction, and the ratios to torch's row."""
    by = {(r["world_size"], r["variant"]): r for r in rows}
    psi = _model(cfg).num_params()
    link = Link.ethernet_25g()
    for r in map(add_speed, rows):
        r["mem_kib"] = r["memory"]["total"] / 1024
        r["peak_param_kib"] = None if r["params_peak"] is None else r["params_peak"] / 1024
        pred = zero_rank_bytes([psi], r["world_size"], r["stage"], 4, 4, 8)
        r["predicted_kib"] = pred["total"] / 1024
        emulated = r["variant"].endswith(EMULATED)  # not comparable with a real gloo run
        theirs = None if emulated else by.get((r["world_size"], TORCH[r["stage"]]))
        r["vs_torch"] = speedup(r, theirs)
        r["mem_vs_torch"] = r["memory"]["total"] / theirs["memory"]["total"] if theirs else None
        r["kib_sent"] = None if r["bytes"] is None else r["bytes"] / 1024
        r["formula_kib"] = r["formula_bytes"] / 1024
        r["predicted_comm_ms"] = (1e3 * zero_step_time(psi, r["world_size"], r["stage"],
                                                       link.alpha, 1 / link.bandwidth, 4)
                                  if emulated else None)
    return rows


COLUMNS = [("world_size", "ranks", "d"), ("stage", "stage", "d"), ("variant", "variant", "s"),
           ("ms", "ms/step", ".1f"), ("steps_per_s", "steps/s", ".1f"),
           ("vs_torch", "speed vs torch", ".2f"), ("mem_kib", "state KiB/rank", ".0f"),
           ("predicted_kib", "ZeRO formula KiB", ".0f"),
           ("peak_param_kib", "peak param KiB", ".0f"), ("mem_vs_torch", "mem vs torch", ".2f"),
           ("kib_sent", "KiB sent/step", ".0f"), ("formula_kib", "formula KiB", ".0f"),
           ("predicted_comm_ms", "alpha-beta comm ms", ".1f")]


NOTES = ("state KiB/rank: parameters + gradients + optimizer state held between steps, "
         "measured;\npeak param KiB: the most parameter bytes held at once during the step "
         "(minidist's count; torch keeps none on CPU);\nZeRO formula: zero_rank_bytes with "
         "4-byte parameters and gradients, K = 8 (AdamW's two moments)")


def _summary(r: dict) -> str | None:
    if r["variant"].startswith("minidist") and r["vs_torch"] is not None:
        return (f"{r['world_size']} ranks, {r['variant']}: {r['vs_torch']:.2f}x the "
                f"steps/s of {TORCH[r['stage']]}, {r['mem_vs_torch']:.2f}x its memory")
    return None


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p, marker in zip(sorted({r["world_size"] for r in rows}), "os^"):
        for who, style in (("minidist stage", "-"), ("torch", "--")):
            pts = sorted((r["stage"], r) for r in rows if r["world_size"] == p
                         and r["variant"].startswith(who) and r["variant"] != PREFETCH
                         and not r["variant"].endswith(EMULATED))
            label = f"{'minidist' if who.startswith('minidist') else 'torch'}, {p} ranks"
            ax1.plot([s for s, _ in pts], [r["ms"] for _, r in pts], style, marker=marker,
                     label=label)
            ax2.plot([s for s, _ in pts], [r["mem_kib"] for _, r in pts], style, marker=marker,
                     label=label)
    for ax, ylabel, title in ((ax1, "ms per step", "Step time (lower is better)"),
                              (ax2, "KiB per rank", "Model state held between steps")):
        ax.set_xticks(range(4), [f"stage {s}" for s in range(4)])
        ax.set(xlabel="ZeRO stage (torch: its counterpart)", ylabel=ylabel, title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path)


SPEC = Bench(
    quick_help="a small model, few steps (CI)", full=FULL, quick=QUICK,
    lists={"world_sizes": "2,4"}, options=OPTIONS,
    configure=lambda preset, args: dict(preset, emulated=args.emulated),
    cases=_cases, derive=derive, columns=COLUMNS,
    header="GPT {n_layer} layers x {n_embd} ({millions:.2f} M parameters, tied head), float32, "
           "AdamW, batch {batch} x {block_size} tokens per rank, one torch thread per rank\n",
    notes=NOTES,
    summary=_summary, parameters=lambda cfg: _model(cfg).num_params(), plot=plot)
add_arguments, main = SPEC.add_arguments, SPEC.main
