"""``minidist bench tensor``: Megatron-style tensor parallelism, minidist against torch DTensor.

The same GPT (``md.models.GPT``, float32), the same batch on every rank, the same training
step (forward, vocabulary-parallel cross-entropy, backward, SGD), split over 1, 2 and 4 ranks:

* ``minidist``: ``md.parallelize_gpt`` (Megatron layout), local backend, ``--algorithm``;
* ``minidist naive MLP``: the same with each MLP split the naive way (every output gathered);
* ``minidist sequence parallel``: Megatron's layout plus sequence parallelism;
* ``torch DTensor``: ``torch.distributed.tensor.parallel.parallelize_module`` with
  ``ColwiseParallel`` / ``RowwiseParallel`` (embedding ``RowwiseParallel``, head
  ``ColwiseParallel`` into ``loss_parallel``) on a gloo process group
  (``parallel.tensor.torch_reference``);
* ``minidist, <link> (emulated)``: ``minidist`` on the emulated network, every pair of ranks
  joined by a fast intra-node link (NVLink 4) or a slow one (25 GbE), ring all-reduces, with
  the communication time the alpha-beta formulas predict (``costmodel.tp.step_comm_time``)
  beside the replayed one: why tensor parallelism stays inside a node.

Reported per row, best of ``--rounds`` interleaved runs (all rounds in the JSON): ms and
steps/s (median step of the slowest rank); the *communication share*: the time of the step's
collectives (``costmodel.tp.step_collectives``: for Megatron's layout (4L+2) all-reduces of b*s*h
elements and 3 of b*s) replayed alone on the same backend, over the step time; bytes each
rank sends per step, counted by ``comm.stats`` (minidist only: gloo's traffic is invisible
to it) against ``costmodel.tp`` for the paths the all-reduces took; parameter bytes
per rank against the full model's, and the activation bytes autograd keeps for backward per
rank (sequence parallelism's gain); speed over torch DTensor. Machines with fewer cores than
ranks share them, which inflates every multi-rank time.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch

from ..collectives import all_gather, all_reduce, auto, reduce_scatter
from ..costmodel import collectives as collective_costs
from ..costmodel import tp as costs
from ..launch import launch
from ..models import GPT, GPTConfig, synthetic_tokens
from ..parallel.tensor import parallelize_gpt
from ..parallel.tensor.torch_reference import torch_loss, torch_parallelize
from ..transports.network import Link, Network
from .spec import Bench, add_speed, option, slowest, speedup
from .timing import local_shard, pyplot

LAYOUTS = {"minidist": "megatron", "minidist naive MLP": "naive_mlp",
           "minidist sequence parallel": "sequence_parallel"}
VARIANTS = (*LAYOUTS, "torch DTensor")
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
COLLECTIVES = {"all_gather": all_gather, "reduce_scatter": reduce_scatter}
LINKS = {"NVLink 4": Link.nvlink4, "25 GbE": Link.ethernet_25g}
FULL = {"n_layer": 4, "n_head": 8, "n_embd": 256, "vocab_size": 1024, "block_size": 64,
        "batch": 8, "steps": 10, "world_sizes": (1, 2, 4), "rounds": 3}
QUICK = {"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 64, "block_size": 16,
         "batch": 2, "steps": 3, "world_sizes": (1, 2), "rounds": 1}


OPTIONS = (option("--algorithm", default="auto", help="minidist's all-reduce algorithm"),
           option("--no-emulated", action="store_true", help="skip the emulated network"))


def _build(comm, variant: str, gpt: GPT, algorithm: str):
    """(model, step function doing forward and backward)."""
    if variant == "torch DTensor":
        from torch.distributed.device_mesh import init_device_mesh
        model = torch_parallelize(gpt, init_device_mesh("cpu", (comm.world_size,)))
        return model, lambda x, y: torch_loss(model, x, y)
    layout = LAYOUTS[variant]
    tp = parallelize_gpt(gpt, comm, algorithm=algorithm, naive_mlp=layout == "naive_mlp",
                         sequence_parallel=layout == "sequence_parallel")
    return tp, lambda x, y: tp(x, y)[1].backward()


def _local_bytes(model) -> int:
    """Parameter bytes held on this rank (a DTensor counts its local shard)."""
    return sum(local_shard(p).numel() * local_shard(p).element_size() for p in model.parameters())


def _saved_bytes(model, step, x, y) -> int:
    """Bytes autograd keeps for backward in one step on this rank: the activations, each
    storage once, the parameters left out."""
    seen = {local_shard(p).untyped_storage().data_ptr() for p in model.parameters()}
    total = 0

    def pack(t):
        nonlocal total
        storage = local_shard(t).untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(x, y)
    return total


def _replay(comm, variant: str, cfg: dict, calls: list[tuple[str, int]],
            algorithm: str) -> float:
    """Seconds for the step's collectives (``costmodel.tp.step_collectives``) run alone."""
    bufs = [(name, torch.zeros(n)) for name, n in calls]
    if variant == "torch DTensor":
        import torch.distributed as dist

        def once():
            for _, b in bufs:  # torch's plan has no all-gathers: only all-reduces
                dist.all_reduce(b)
    else:
        def once():
            for name, b in bufs:
                if name == "all_reduce":
                    all_reduce(comm, b, algorithm=algorithm)
                else:
                    COLLECTIVES[name](comm, b)
    samples = []
    for i in range(max(3, cfg["steps"] // 2) + 1):
        start = time.perf_counter()
        once()
        if i:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _formula_bytes(comm, calls: list[tuple[str, int]], algorithm: str) -> int:
    """Bytes this rank should send per step: each all-reduce by the path it takes."""
    total = 0
    for name, n in calls:
        if name == "all_reduce":
            name = auto.choose(comm, torch.zeros(n)) if algorithm == "auto" else algorithm
            name = "ring" if name == "native" else name  # what gloo's ring would send
        total += collective_costs.bytes_sent(name, n, 4, comm.world_size, comm.rank)
    return total


def _run_rank(comm, variant: str, cfg: dict, algorithm: str) -> dict:
    gpt = GPT(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS}))
    model, step = _build(comm, variant, gpt, algorithm)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = synthetic_tokens(1, cfg["batch"], cfg["block_size"], cfg["vocab_size"], seed=0)[0]
    times, sent = [], None
    for i in range(cfg["steps"] + 2):
        comm.stats.reset()
        start = time.perf_counter()
        opt.zero_grad()
        step(x, y)
        opt.step()
        if i >= 2:  # warm-up steps are not counted
            times.append(time.perf_counter() - start)
            sent = comm.stats.bytes_sent
    calls = costs.step_collectives(gpt.config, cfg["batch"], cfg["block_size"], comm.world_size,
                                   LAYOUTS.get(variant, "megatron"))
    native = variant == "torch DTensor"
    return {"step_s": statistics.median(times),
            "comm_s": _replay(comm, variant, cfg, calls, algorithm),
            "bytes": None if native else sent,
            "formula_bytes": _formula_bytes(comm, calls, "ring" if native else algorithm),
            "param_bytes": _local_bytes(model), "full_bytes": _local_bytes(gpt),
            "saved_bytes": _saved_bytes(model, step, x, y)}


def measure(variant: str, p: int, cfg: dict, algorithm: str, link: str | None = None) -> dict:
    """One launch; on an emulated link with the ring, and the ring formula's time beside it."""
    backend = "torch" if variant == "torch DTensor" else "local"
    network = Network.uniform(LINKS[link]()) if link else None
    algorithm = "ring" if link else algorithm
    ranks = launch(_run_rank, p, args=(variant, cfg, algorithm), backend=backend,
                   network=network, timeout=300)
    predicted = None
    if link:
        gpt_cfg = GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})
        predicted = costs.step_comm_time(gpt_cfg, cfg["batch"], cfg["block_size"], 4, p,
                                         LINKS[link]().alpha, LINKS[link]().bandwidth)
    return dict(slowest(ranks), bytes=ranks[0]["bytes"], formula_bytes=ranks[0]["formula_bytes"],
                predicted_comm_s=predicted)


def _cases(cfg: dict) -> list[tuple[dict, partial]]:
    """Every (world size, variant); with ``emulated``, minidist on each link (p > 1)."""
    world_sizes = cfg["world_sizes"]
    plan = [(p, v, None) for p in world_sizes for v in VARIANTS]
    if cfg["emulated"]:
        plan += [(p, f"minidist, {k} (emulated)", k) for p in world_sizes if p > 1
                 for k in LINKS]
    return [({"world_size": p, "variant": name},
             partial(measure, "minidist" if link else name, p, cfg, cfg["algorithm"], link))
            for p, name, link in plan]


def derive(rows: list[dict], cfg: dict | None = None) -> list[dict]:
    by = {(r["world_size"], r["variant"]): r for r in rows}
    for r in map(add_speed, rows):
        r["comm_share"] = min(1.0, r["comm_s"] / r["step_s"])
        r["comm_ms"] = r["comm_s"] * 1e3
        r["predicted_ms"] = None if r["predicted_comm_s"] is None else r["predicted_comm_s"] * 1e3
        r["memory_vs_full"] = r["param_bytes"] / r["full_bytes"]
        theirs = by.get((r["world_size"], "torch DTensor"))
        emulated = "emulated" in r["variant"]
        r["vs_torch"] = None if emulated else speedup(r, theirs)
    return rows


COLUMNS = [("world_size", "ranks", "d"), ("variant", "variant", "s"), ("ms", "ms/step", ".1f"),
           ("steps_per_s", "steps/s", ".1f"), ("comm_share", "comm share", ".0%"),
           ("comm_ms", "comm ms", ".1f"), ("predicted_ms", "predicted", ".1f"),
           ("bytes", "sent/step", "bytes"), ("formula_bytes", "formula", "bytes"),
           ("param_bytes", "params/rank", "bytes"), ("memory_vs_full", "vs full", ".2f"),
           ("saved_bytes", "activations/rank", "bytes"),
           ("vs_torch", "vs torch", ".2f")]


def _params(cfg: dict) -> int:
    return GPT(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})).num_params()


NOTES = ("comm share: the step's collectives replayed alone on the same backend / step time;"
         "\nsent/step: comm.stats on rank 0 (gloo's bytes are invisible to minidist); formula:"
         "\ncostmodel.tp for the paths the all-reduces took (ring for torch);"
         "\n(emulated) rows: this machine's compute, messages timed as the named link would,"
         "\nring all-reduces; predicted: costmodel.tp.step_comm_time for that link (alpha-beta);"
         "\nactivations/rank: bytes autograd saves for backward in one step (parameters not "
         "counted)")


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    sizes = sorted({r["world_size"] for r in rows})
    names = list(dict.fromkeys(r["variant"] for r in rows))
    by = {(r["world_size"], r["variant"]): r for r in rows}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i, p in enumerate(sizes)
              if (p, name) in by]
        got = [by[p, name] for p in sizes if (p, name) in by]
        ax1.bar(xs, [r["steps_per_s"] for r in got], width, label=name)
        ax2.bar(xs, [100 * r["comm_share"] for r in got], width, label=name)
    for ax, label, title in ((ax1, "steps/s", "Training speed (higher is better)"),
                             (ax2, "% of the step", "Communication share")):
        ax.set_xticks(range(len(sizes)), [f"{p} rank{'s' if p > 1 else ''}" for p in sizes])
        ax.set(xlabel="tensor-parallel world size", ylabel=label, title=title)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax1.get_legend_handles_labels()  # one legend, below: it hides no bar
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize="small")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=120)


SPEC = Bench(
    quick_help="a tiny GPT, few steps (CI)", full=FULL, quick=QUICK,
    lists={"world_sizes": "1,2,4"}, options=OPTIONS,
    configure=lambda preset, args: dict(preset, algorithm=args.algorithm,
                                        emulated=not args.no_emulated),
    cases=_cases, derive=derive, columns=COLUMNS,
    header="GPT {n_layer} layers x {n_embd} wide, {n_head} heads, vocabulary {vocab_size} "
           "({millions:.2f} M parameters), batch {batch} x {block_size} tokens on every rank, "
           "float32, SGD; minidist all-reduce algorithm {algorithm!r}\n", notes=NOTES,
    summary=(lambda r: r["world_size"] == 2 and r["vs_torch"] is not None
             and r["variant"] != "torch DTensor",
             "world size 2, {variant}: {vs_torch:.2f}x the steps/s of torch DTensor (goal: 1.5x)"),
    parameters=_params, plot=plot)
add_arguments, main = SPEC.add_arguments, SPEC.main
