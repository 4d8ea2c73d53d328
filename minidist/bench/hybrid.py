"""``minidist bench hybrid``: every dp x pp x tp layout of 8 ranks, measured here and predicted.

Measured (this machine, one run): the small GPT (``md.models.GPT``, float32, AdamW) trained
by ``parallel.hybrid.HybridGPT`` on the mesh {"dp", "pp", "tp"} for every layout whose
sizes multiply to ``--world`` (8): the same global batch, m = the replica's batch in
micro-batches of one sequence when pp > 1 (1F1B), one micro-batch otherwise. Rows:

* ``minidist``: plain data parallelism over dp (one all-reduce after the last micro-batch);
* ``minidist ZeRO-1``: the dp dimension is ``md.ZeRO(stage=1)`` (layouts with dp > 1);
* ``torch``: the pp = 1 layouts in torch's own pieces on gloo: ``init_device_mesh("cpu",
  (dp, tp), mesh_dim_names=("dp", "tp"))``, DTensor tensor parallelism over ``mesh["tp"]``
  (``parallel.tensor.torch_reference``) and the gradients all-reduced over ``mesh["dp"]``'s
  process group. torch has no stage-splitting runtime that combines with DTensor on gloo
  in a few lines, so pp > 1 has no torch row (``minidist bench pipeline`` compares the
  pipeline schedules with ``torch.distributed.pipelining``).

Per row, best of ``--rounds`` interleaved runs: ms per step (median step of the slowest
rank), steps/s, and per rank the bytes of parameters + gradients + optimizer state
(``HybridGPT.memory()``: measured from the storages held; the largest rank) and the peak
activation bytes a pipeline stage kept for backward. 8 ranks share this machine's cores,
so every time here is dominated by oversubscription; the memory columns are exact.

Predicted (``md.costmodel.predict_layouts``: ``md.costmodel.predict`` of one plan per
layout): the same layouts for a large GPT (6.7B: 32 layers, hidden 4096) on a described
cluster of 2 nodes x 4 H100 (NVLink 4 inside, InfiniBand NDR across, 400 TFLOP/s achieved),
global batch 64 in micro-batches of one sequence, 1F1B, bf16 mixed precision: memory per GPU
(plain and ZeRO-1), whether it fits in 80 GB, and the step split into compute, bubble and
tp / pp / dp communication, with the dimensions whose groups cross nodes. The PTD-P rule
shows in it: tp = 8 must cross the node boundary and pays for it; the fastest layout that
fits is marked.
"""

from __future__ import annotations

from functools import partial

import torch

from ..costmodel import Cluster, GPTShape, fastest_fitting, predict_layouts
from ..costmodel.cluster import crossing_dims
from ..costmodel.planner import layouts
from ..launch import launch
from ..models import GPT, lm_loss, synthetic_tokens
from ..parallel.hybrid import HybridGPT
from ..parallel.mesh import DeviceMesh
from ..parallel.zero.flat_shards import storage_bytes
from ..transports.network import Link, Network
from .spec import Bench, add_speed, option, speedup
from .timing import format_table, gpt_config, local_shard, median_time, pyplot, save_figure

EMULATED = "minidist (emulated)"
VARIANTS = ("minidist", "minidist ZeRO-1", "torch", EMULATED)
FULL = {"n_layer": 6, "n_head": 8, "n_embd": 128, "vocab": 256, "block": 64, "batch": 16,
        "steps": 5, "world": 8, "rounds": 3, "zero": True}
QUICK = {"n_layer": 2, "n_head": 4, "n_embd": 16, "vocab": 32, "block": 8, "batch": 8,
         "steps": 2, "world": 4, "rounds": 1, "zero": False}
LARGE = GPTShape(layers=32, hidden=4096, heads=32, vocab=51200, seq=2048, name="GPT 6.7B")
# 400 TFLOP/s achieved: given as the peak, at efficiency 1
CLUSTER = Cluster(nodes=2, per_node=4, intra=Link.nvlink4(), inter=Link.infiniband_ndr(),
                  peak_flops={"bf16": 400e12}, memory=80e9,
                  name="2 nodes x 4 H100, NVLink 4 + IB NDR")
LARGE_BATCH = 64


OPTIONS = (option("--world", type=int, help="ranks (default 8; 4 in quick mode)"),
           option("--network", action="store_true",
                  help="also run minidist on an emulated cluster of 2 nodes (NVLink 4 inside, "
                       "25 GbE across)"))


def _microbatches(layout: tuple[int, int, int], batch: int) -> int:
    dp, pp, _ = layout
    return batch // dp if pp > 1 else 1


def _minidist_rank(comm, layout, cfg: dict, zero_stage, algorithm: str) -> dict:
    mesh = DeviceMesh(comm, dict(zip(("dp", "pp", "tp"), layout)))
    model = HybridGPT(gpt_config(cfg), mesh, _microbatches(layout, cfg["batch"]),
                      zero_stage=zero_stage, optimizer_class=torch.optim.AdamW,
                      algorithm=algorithm, lr=1e-3)
    x, y = synthetic_tokens(1, cfg["batch"], cfg["block"], cfg["vocab"], seed=0)[0]
    step_s = median_time(lambda: model.step(x, y), cfg["steps"], warmup=1)
    return {"step_s": step_s, "state_bytes": model.memory()["total"],
            "activation_bytes": model.stage.peak_activation_bytes}


def _local_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, a DTensor counted by its local shard."""
    return storage_bytes(local_shard(t) for t in tensors if t is not None)


def _torch_rank(comm, layout, cfg: dict) -> dict:
    """The pp = 1 layout in torch: DTensor tp over mesh["tp"], gradients averaged over dp."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ..parallel.tensor.torch_reference import torch_loss, torch_parallelize
    dp, _, tp = layout
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    gpt = GPT(gpt_config(cfg))
    model = torch_parallelize(gpt, mesh["tp"]) if tp > 1 else gpt
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = synthetic_tokens(1, cfg["batch"], cfg["block"], cfg["vocab"], seed=0)[0]
    x, y = x.tensor_split(dp)[mesh["dp"].get_local_rank()], y.tensor_split(dp)[
        mesh["dp"].get_local_rank()]

    def step() -> None:
        opt.zero_grad()
        if tp > 1:
            torch_loss(model, x, y)  # forward and backward
        else:
            lm_loss(model(x)[0], y).backward()
        if dp > 1:  # one all-reduce of all gradients, as HybridGPT's coalesced one
            grads = [local_shard(p.grad) for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=mesh["dp"].get_group())
            for g, part in zip(grads, flat.div_(dp).split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))
        opt.step()

    step_s = median_time(step, cfg["steps"], warmup=1)
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    params = list(model.parameters())
    return {"step_s": step_s, "activation_bytes": None,
            "state_bytes": _local_bytes(params) + _local_bytes(p.grad for p in params)
            + _local_bytes(state)}


def measure(variant: str, layout, cfg: dict) -> dict:
    world = layout[0] * layout[1] * layout[2]
    if variant == "torch":
        ranks = launch(_torch_rank, world, args=(layout, cfg), backend="torch", timeout=300)
    elif variant == EMULATED:  # ring all-reduces: every message crosses the emulated links
        ranks = launch(_minidist_rank, world, args=(layout, cfg, None, "ring"), timeout=300,
                       network=_emulated_cluster(world))
    else:
        zero = 1 if variant == "minidist ZeRO-1" else None
        ranks = launch(_minidist_rank, world, args=(layout, cfg, zero, "auto"), timeout=300)
    acts = [r["activation_bytes"] for r in ranks if r["activation_bytes"] is not None]
    return {"step_s": max(r["step_s"] for r in ranks),
            "state_bytes": max(r["state_bytes"] for r in ranks),
            "activation_bytes": max(acts) if acts else None}


def _emulated_cluster(world: int) -> Network:
    """Two nodes of world / 2 ranks: rank r on node r // (world / 2), as the cost model's
    ``Cluster`` numbers them."""
    return Network.cluster(2, world // 2, Link.nvlink4(), Link.ethernet_25g())


def _cases(world: int, zero: bool, network: bool) -> list[tuple[str, tuple[int, int, int]]]:
    cases = []
    for layout in layouts(world):
        dp, pp, _ = layout
        cases.append(("minidist", layout))
        if zero and dp > 1:
            cases.append(("minidist ZeRO-1", layout))
        if pp == 1:
            cases.append(("torch", layout))
        if network:
            cases.append((EMULATED, layout))
    return cases


def _measured(cfg: dict) -> list[tuple[dict, partial]]:
    return [(dict(layout="x".join(map(str, layout)), dp=layout[0], pp=layout[1], tp=layout[2],
                  variant=variant, microbatches=_microbatches(layout, cfg["batch"]),
                  crossing=_crossing(layout, cfg["world"] // 2) if variant == EMULATED
                  else None),
             partial(measure, variant, layout, cfg))
            for variant, layout in _cases(cfg["world"], cfg["zero"], cfg.get("network"))]


def derive(rows: list[dict], cfg: dict | None = None) -> list[dict]:
    """Add ms, steps/s and the speed-up over torch's row of the same layout."""
    theirs = {r["layout"]: r for r in rows if r["variant"] == "torch"}
    for r in map(add_speed, rows):
        ours = r["variant"] in ("minidist", "minidist ZeRO-1")  # not the emulated rows
        r["vs_torch"] = speedup(r, theirs.get(r["layout"])) if ours else None
    return rows



def _crossing(layout: tuple[int, int, int], per_node: int) -> str:
    return ",".join(crossing_dims(layout, per_node)) or "-"


def run_predicted() -> list[dict]:
    """The cost model's rows for LARGE on CLUSTER, plain dp and ZeRO-1 memory side by side."""
    plain = predict_layouts(LARGE, CLUSTER, LARGE_BATCH)
    zero1 = predict_layouts(LARGE, CLUSTER, LARGE_BATCH, zero_stage=1)
    best, rows = fastest_fitting(plain), []
    for pred, z in zip(plain, zero1):
        r = pred.row()
        r["layout"] = f"{r['dp']}x{r['pp']}x{r['tp']}"
        r["zero1_memory_bytes"], r["zero1_fits"] = z.memory["total"], z.fits
        r["fits_text"] = "yes" if r["fits"] else "no"
        r["best"] = "<- fastest that fits" if pred is best else ""
        r.update({k.replace("_s", "_ms"): r[k] * 1e3 for k in
                  ("compute_s", "bubble_s", "tp_s", "pp_s", "dp_s", "step_s")})
        r.update({k.replace("_bytes", "_gb"): r[k] / 1e9 for k in
                  ("memory_bytes", "zero1_memory_bytes")})
        rows.append(r)
    return rows


MEASURED = [("layout", "dp x pp x tp", "s"), ("variant", "variant", "s"),
            ("microbatches", "m", "d"), ("ms", "ms/step", ".1f"), ("steps_per_s", "steps/s", ".2f"),
            ("state_bytes", "state/rank", "bytes"), ("activation_bytes", "activations", "bytes"),
            ("vs_torch", "vs torch", ".2f"), ("crossing", "crosses nodes", "s")]
PREDICTED = [("layout", "dp x pp x tp", "s"), ("crossing", "crosses nodes", "s"),
             ("microbatches", "m", "d"), ("memory_gb", "GB/GPU", ".1f"), ("fits_text", "fits", "s"),
             ("zero1_memory_gb", "ZeRO-1 GB", ".1f"), ("compute_ms", "compute ms", ".0f"),
             ("bubble_ms", "bubble ms", ".0f"), ("tp_ms", "tp ms", ".0f"),
             ("pp_ms", "pp ms", ".0f"), ("dp_ms", "dp ms", ".0f"), ("step_ms", "step ms", ".0f"),
             ("best", "", "s")]


def _params(cfg: dict) -> int:
    return GPT(gpt_config(cfg)).num_params()


def _notes(rows: list[dict], cfg: dict) -> str:
    """What the measured table shows, then the predicted table."""
    return ("state/rank: parameters + gradients + optimizer state held by the largest rank; "
            "activations: the largest\npipeline stage's peak saved for backward. Ranks share "
            "this machine's cores: times show oversubscription.\n(emulated): this machine's "
            "compute, every message timed as on 2 nodes joined by 25 GbE (NVLink 4 inside);\n"
            f"crosses nodes: the dimensions whose groups span both nodes.\n\nPredicted: "
            f"{LARGE.name} ({LARGE.params / 1e9:.1f} B parameters) on {CLUSTER.name}, batch "
            f"{LARGE_BATCH} x 2048 tokens,\nmicro-batches of 1, 1F1B, mixed-precision Adam "
            f"(16 B/parameter), {CLUSTER.memory / 1e9:.0f} GB per GPU\n\n"
            + format_table(run_predicted(), PREDICTED))


def _result(rows: list[dict], cfg: dict) -> dict:
    return {"config": dict(cfg, parameters=_params(cfg)), "rows": rows,
            "predicted": run_predicted(), "large_model": LARGE.__dict__ | {"params": LARGE.params},
            "cluster": {"name": CLUSTER.name, "nodes": CLUSTER.nodes,
                        "per_node": CLUSTER.per_node, "flops": CLUSTER.flops("bf16"),
                        "memory": CLUSTER.memory}}


def plot(measured: list[dict], path: str) -> None:
    """Measured step time and state per layout; the predicted step of each layout, split."""
    plt, predicted = pyplot(), run_predicted()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    names = list(dict.fromkeys(r["layout"] for r in measured))
    by = {(r["layout"], r["variant"]): r for r in measured}
    width = 0.8 / len(VARIANTS)
    for k, variant in enumerate(VARIANTS):
        xs = [i + (k - 1.5) * width for i, n in enumerate(names) if (n, variant) in by]
        got = [by[n, variant] for n in names if (n, variant) in by]
        if got:
            style = {"label": variant, "color": f"C{k}"}
            ax1.bar(xs, [r["ms"] for r in got], width, **style)
            if variant != EMULATED:  # the same bytes as "minidist"
                ax2.bar(xs, [r["state_bytes"] / 2**20 for r in got], width, **style)
    for ax, label, title in ((ax1, "ms per step", "Measured step time (this machine)"),
                             (ax2, "MiB per rank", "Measured state per rank (params+grads+Adam)")):
        ax.set_xticks(range(len(names)), names, rotation=45)
        ax.set(xlabel="layout dp x pp x tp", ylabel=label, title=title)
        ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    bottom = [0.0] * len(predicted)
    for part in ("compute_ms", "bubble_ms", "tp_ms", "pp_ms", "dp_ms"):
        vals = [r[part] for r in predicted]
        ax3.bar(range(len(predicted)), vals, bottom=bottom, label=part.replace("_ms", ""))
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(predicted):
        if not r["fits"]:
            ax3.text(i, bottom[i], "OOM", ha="center", va="bottom", fontsize="small")
    ax3.set_xticks(range(len(predicted)), [r["layout"] for r in predicted], rotation=45)
    ax3.set(xlabel="layout dp x pp x tp", ylabel="ms per step (predicted)",
            title=f"{LARGE.name} on {CLUSTER.nodes} x {CLUSTER.per_node} H100 (cost model)")
    ax3.legend(fontsize="small")
    ax3.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


SPEC = Bench(
    quick_help="a tiny GPT on 4 ranks (CI)", full=FULL, quick=QUICK, options=OPTIONS,
    configure=lambda preset, args: dict(preset, world=args.world or preset["world"],
                                        network=args.network),
    cases=_measured, derive=derive, columns=MEASURED, parameters=_params,
    header="Measured here: GPT {n_layer} layers x {n_embd} ({millions:.2f} M parameters), batch "
           "{batch} x {block} tokens, AdamW, float32, {world} ranks\n", notes=_notes,
    result=_result, plot=plot)
add_arguments, main = SPEC.add_arguments, SPEC.main
