"""``minidist bench amp``: fp32, fp16 + loss scaling and bf16 training, minidist against torch.amp.

The same small GPT, data and AdamW step on 2 ranks (``--world-size``), in one run:

* ``minidist``: ``md.parallel.amp.MixedPrecision`` (the model cast to 16 bits, float32 master
  weights, ``md.GradScaler(comm=comm)`` for fp16) under ``md.DistributedDataParallel`` on the
  local backend; its 16-bit buckets are all-reduced in 16 bits;
* ``torch``: a float32 model under ``torch.autocast("cpu", dtype)`` with
  ``torch.amp.GradScaler`` (fp16) under torch DDP on gloo: torch's recipe (Apex O1), whose
  gradients are float32 and are all-reduced in float32 unless ``--torch-compress`` registers
  torch's ``fp16_compress_hook`` / ``bf16_compress_hook``.

Per row, from the best of ``--rounds`` interleaved rounds (all rounds in the JSON): ms per
step (median step of the slowest rank); ``vs torch`` = torch's ms / minidist's ms (1.0:
equal, above: minidist faster); bytes rank 0 sent per step (minidist: counted by
``comm.stats``, which includes fp16's 4-byte found_inf agreement per step; torch: gloo does
not count, so the ring formula ``all_reduce_bytes`` for its gradient dtype, ``formula``);
bytes of parameters + gradients + master weights + optimizer state held by rank 0 after a
step (measured from the storages); the final loss (mean of the last 5 steps over the
ranks); skipped steps.

What to expect on a CPU: fp16 is *slower* than fp32. x86 cores without AVX512-FP16 / AMX-FP16
(most of them, the newest Xeons aside) have no float16 arithmetic: every float16 op converts
to float32 (F16C), computes, and converts back. bfloat16 dot products run natively with
AVX512-BF16 or AMX-BF16 (the header prints which units this CPU has), so bf16 matmuls can
beat fp32 there while bf16 elementwise ops still convert. The 16-bit wins on a CPU are
bytes: half the communication, half the activations. On a GPU with tensor cores the same
code runs faster in 16 bits. ``--bandwidth GB/s`` runs the minidist
rows on an emulated network (``md.Network.uniform``) where halving the bytes shows in time;
the torch rows always use the real gloo transport (labelled).
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
from torch import nn

from ..checks import integer
from ..launch import launch
from ..models import GPT, CharText, lm_loss
from ..parallel.amp import GradScaler, MixedPrecision, all_reduce_bytes
from ..parallel.data import DistributedDataParallel
from ..parallel.zero.flat_shards import storage_bytes
from ..transports.network import Link, Network
from .spec import Bench, option, speedup
from .timing import gpt_config, pyplot, save_figure

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
IMPLS = ("minidist", "torch")
FULL = {"n_embd": 128, "n_layer": 2, "block": 64, "batch": 16, "steps": 20, "rounds": 3}
QUICK = {"n_embd": 32, "n_layer": 1, "block": 16, "batch": 4, "steps": 4, "rounds": 1}


OPTIONS = (option("--world-size", type=int, default=2, help="ranks (default 2)"),
           option("--torch-compress", action="store_true",
                  help="torch rows all-reduce in 16 bits too (torch's compress hooks)"),
           option("--bandwidth", type=float, metavar="GB/s",
                  help="run the minidist rows on an emulated network of this bandwidth"))


def _minidist_step(comm, precision: str, cfg: dict):
    """Build the minidist trainer; return (one training step, the state to measure)."""
    dtype = PRECISIONS[precision]
    scaler = GradScaler(comm=comm) if dtype == torch.float16 else None
    mp = MixedPrecision(GPT(gpt_config(cfg, tie_weights=True)), torch.optim.AdamW, dtype=dtype,
                        scaler=scaler, lr=1e-3)
    ddp = DistributedDataParallel(mp.model, comm)

    def step(x, y) -> float:
        logits, _ = ddp(x)
        loss = lm_loss(logits.float(), y)
        mp.backward(loss)
        mp.step()
        return loss.item()

    return step, mp.zero_grad, mp.memory, lambda: mp.scaler.skipped_steps if mp.scaler else 0


def _torch_step(comm, precision: str, cfg: dict):
    """torch's recipe: float32 model, autocast forward, torch.amp.GradScaler, torch DDP."""
    dtype = PRECISIONS[precision]
    model = GPT(gpt_config(cfg, tie_weights=True))
    ddp = nn.parallel.DistributedDataParallel(model)
    if cfg["torch_compress"] and dtype != torch.float32:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks
        hook = hooks.fp16_compress_hook if dtype == torch.float16 else hooks.bf16_compress_hook
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    skipped = [0]

    def step(x, y) -> float:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            logits, _ = ddp(x)
        loss = lm_loss(logits.float(), y)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped[0] += int(scaler.get_scale() < before)
        return loss.item()

    def memory() -> dict:
        params = list(model.parameters())
        state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        out = {"params": storage_bytes(params), "grads": storage_bytes(p.grad for p in params),
               "master": 0, "optimizer": storage_bytes(state)}
        out["total"] = sum(out.values())
        return out

    return step, lambda: opt.zero_grad(set_to_none=True), memory, lambda: skipped[0]


def _run_rank(comm, impl: str, precision: str, cfg: dict) -> dict:
    torch.manual_seed(0)
    build = _minidist_step if impl == "minidist" else _torch_step
    step, zero_grad, memory, skipped = build(comm, precision, cfg)
    data = CharText().batches(cfg["steps"] + 3, cfg["batch"], cfg["block"], seed=comm.rank)
    times, sent, losses, mem = [], [], [], {}
    for i, (x, y) in enumerate(data):
        start, before = time.perf_counter(), comm.stats.bytes_sent
        losses.append(step(x, y))
        if i >= 3:  # warm-up steps are not counted
            times.append(time.perf_counter() - start)
            sent.append(comm.stats.bytes_sent - before)
        mem = memory()  # after the step, before zero_grad: gradients held
        zero_grad()
    return {"step_s": statistics.median(times), "sent": statistics.median(sent),
            "memory": mem, "losses": losses, "skipped": skipped()}


def measure(impl: str, precision: str, cfg: dict) -> dict:
    p = cfg["world_size"]
    if impl == "torch":
        ranks = launch(_run_rank, p, args=(impl, precision, cfg), backend="torch")
    else:
        net = None if cfg["bandwidth"] is None else \
            Network.uniform(Link(alpha=10e-6, bandwidth=cfg["bandwidth"] * 1e9))
        ranks = launch(_run_rank, p, args=(impl, precision, cfg), network=net)
    r0 = ranks[0]
    out = {"step_s": max(r["step_s"] for r in ranks), "memory": r0["memory"],
           "final_loss": statistics.mean(x for r in ranks for x in r["losses"][-5:]),
           "skipped": r0["skipped"], "bytes": r0["sent"], "bytes_source": "comm.stats"}
    if impl == "torch":  # gloo does not count bytes: the ring formula for its gradients
        n = GPT(gpt_config(cfg, tie_weights=True)).num_params()
        dtype = PRECISIONS[precision] if cfg["torch_compress"] else torch.float32
        out["bytes"], out["bytes_source"] = all_reduce_bytes(n, p, dtype), "formula"
    return out


def _cases(cfg: dict) -> list[tuple[dict, partial]]:
    return [({"precision": prec, "impl": impl}, partial(measure, impl, prec, cfg))
            for prec in PRECISIONS for impl in IMPLS]


def derive(rows: list[dict], cfg: dict | None = None) -> list[dict]:
    """ms, vs torch, bytes relative to the same implementation's fp32, memory in KiB."""
    by = {(r["precision"], r["impl"]): r for r in rows}
    for r in rows:
        r["ms"] = r["step_s"] * 1e3
        theirs = by.get((r["precision"], "torch"))
        r["vs_torch"] = speedup(r, theirs) if r["impl"] != "torch" else None
        fp32 = by[("fp32", r["impl"])]
        r["bytes_vs_fp32"] = r["bytes"] / fp32["bytes"] if fp32["bytes"] else None
        r["time_vs_fp32"] = r["step_s"] / fp32["step_s"]
        r["memory_bytes"] = r["memory"]["total"]
        r["memory_kib"] = r["memory_bytes"] / 1024
        r["sent_label"] = f"{r['bytes'] / 1024:.1f}" + \
            (" (formula)" if r["bytes_source"] == "formula" else "")
    return rows


COLUMNS = [("precision", "precision", "s"), ("impl", "implementation", "s"),
           ("ms", "ms/step", ".1f"), ("vs_torch", "vs torch", ".2f"),
           ("time_vs_fp32", "time vs fp32", ".2f"), ("sent_label", "KiB sent/step", "s"),
           ("bytes_vs_fp32", "bytes vs fp32", ".2f"), ("memory_kib", "state KiB", ".0f"),
           ("final_loss", "final loss", ".3f"), ("skipped", "skipped", "d")]


def cpu_16bit_units() -> str:
    """The 16-bit arithmetic this CPU advertises (Linux ``/proc/cpuinfo`` flags): F16C only
    converts; AVX512-BF16 / AMX-BF16 compute bfloat16 dot products; AVX512-FP16 / AMX-FP16
    compute float16."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    wanted = ("f16c", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
    return ", ".join(w for w in wanted if w in flags) or "none"


def _configure(preset: dict, args) -> dict:
    integer(args.world_size, "--world-size", low=2, error=TypeError)  # DDP needs two ranks
    return dict(preset, world_size=args.world_size, torch_compress=args.torch_compress,
                bandwidth=args.bandwidth)


def _params(cfg: dict) -> int:
    return GPT(gpt_config(cfg, tie_weights=True)).num_params()


def _header(cfg: dict) -> str:
    text = (f"GPT {cfg['n_layer']} layers x {cfg['n_embd']} ({_params(cfg) / 1e6:.2f} M "
            f"parameters), batch {cfg['batch']} x {cfg['block']} tokens per rank, "
            f"{cfg['world_size']} ranks, AdamW, one torch thread per rank\nCPU: torch "
            f"capability {torch.backends.cpu.get_cpu_capability()}, 16-bit units: "
            f"{cpu_16bit_units()}")
    if cfg["bandwidth"]:
        text += (f"\nminidist rows on an emulated {cfg['bandwidth']:g} GB/s network; torch "
                 "rows on gloo")
    return text


NOTES = ("vs torch: torch's ms / minidist's ms (above 1: minidist faster). KiB sent/step: "
         "rank 0; torch's from the ring formula (gloo does not count).\nstate KiB: params + "
         "grads + master weights + optimizer state of rank 0 after a step.\ntime vs fp32: "
         "above 1 means 16 bits are slower here. Without avx512_fp16/amx_fp16 a CPU has no "
         "float16 arithmetic units: every float16 op converts to float32 and back (F16C);\n"
         "bfloat16 dot products run natively only with avx512_bf16/amx_bf16.")


def _result(rows: list[dict], cfg: dict) -> dict:
    return {"config": dict(cfg, parameters=_params(cfg), cpu_16bit_units=cpu_16bit_units()),
            "rows": rows}


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    by = {(r["precision"], r["impl"]): r for r in rows}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("ms", "ms per step", "Step time (lower is better)"),
              ("bytes", "KiB sent per step (rank 0)", "Communication"),
              ("memory_bytes", "KiB", "Params + grads + master + optimizer"))
    for ax, (key, label, title) in zip(axes, panels):
        for k, impl in enumerate(IMPLS):
            xs = [i + (k - 0.5) * 0.4 for i in range(len(PRECISIONS))]
            ys = [by[p, impl][key] / (1024 if key != "ms" else 1) for p in PRECISIONS]
            formula = key == "bytes" and impl == "torch"  # gloo does not count its bytes
            ax.bar(xs, ys, 0.4, label=f"{impl} (ring formula)" if formula else impl,
                   hatch="//" if formula else None)
        ax.set_xticks(range(len(PRECISIONS)), list(PRECISIONS))
        ax.set(xlabel="precision", ylabel=label, title=title)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="lower right" if key == "memory_bytes" else "best")
    save_figure(fig, path)


SPEC = Bench(
    quick_help="a tiny GPT, few steps (CI)", full=FULL, quick=QUICK, options=OPTIONS,
    configure=_configure, cases=_cases, derive=derive, columns=COLUMNS, header=_header,
    notes=NOTES, result=_result, plot=plot,
    summary=(lambda r: r["impl"] == "minidist", "{precision}: minidist {vs_torch:.2f}x torch's "
             "speed, {bytes_vs_fp32:.2f}x the bytes of its fp32 run"))
add_arguments, main = SPEC.add_arguments, SPEC.main
