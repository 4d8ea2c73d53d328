"""``minidist bench pipeline``: minidist's naive split, GPipe, 1F1B and interleaved 1F1B
against torch.distributed.pipelining's schedules on gloo.

The same GPT (untied head, ``GPT.stages()`` cut into p stages of equal layer counts), the
same batch cut into the same m micro-batches, SGD after every step, in one run, for two
sizes of GPT: ``tiny`` (0.03 M parameters: what a schedule itself costs, messages and
bookkeeping, dominates) and ``small`` (1.2 M: the matrix products dominate):

* ``minidist naive``: ``md.pipeline.ScheduleNaive`` with one micro-batch (the model split,
  no pipelining): bubble (p - 1) / p;
* ``minidist GPipe`` / ``minidist 1F1B``: ``md.ScheduleGPipe`` / ``md.Schedule1F1B``, local
  backend (shared memory);
* ``minidist interleaved``: ``md.pipeline.ScheduleInterleaved1F1B`` with v = 2 model chunks
  per rank (where the GPT has 2p layers to cut): bubble (p - 1) / (v m + p - 1);
* ``torch GPipe`` / ``torch 1F1B`` / ``torch interleaved``: ``torch.distributed.pipelining``'s
  ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B on a gloo group;
* with ``--network``: the minidist schedules again over the emulated network (each message
  pays alpha + bytes / bandwidth), labelled "(emulated)". torch cannot run there.

Reported per schedule and stage count, from the best of ``--rounds`` interleaved runs:
milliseconds and steps per second (median step of the slowest rank); the measured bubble of
one traced step, 1 - busy / (p x span) over the stages' forward and backward spans (minidist:
``comm.timeline``; torch: the same spans taken with module and autograd hooks), against
``md.costmodel.bubble_fraction(p, m)`` = (p - 1) / (m + p - 1); the peak activation memory
held for backward on each stage (``md.pipeline.LiveSavedBytes``, the same meter for both);
and the speed-up over torch's schedule of the same name. Ranks share this machine's cores:
with more ranks than cores an idle stage lends its core to a busy one, so the bubble costs
less time here than on p real devices, and the measured bubble can sit below the formula.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
from torch import nn

from ..costmodel import bubble_fraction
from ..launch import launch
from ..models import GPT, lm_loss, synthetic_tokens
from ..parallel.pipeline import (
    LiveSavedBytes,
    ModuleSpans,
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleNaive,
    measured_bubble,
    split_model,
)
from ..transports.network import Link, Network
from .spec import Bench, add_speed, option, speedup
from .timing import gpt_config, pyplot, save_figure

VARIANTS = ("minidist naive", "minidist GPipe", "minidist 1F1B", "minidist interleaved",
            "torch GPipe", "torch 1F1B", "torch interleaved")
V = 2  # model chunks per rank in the interleaved schedule
MODELS = {  # tiny: the schedule's own overhead dominates; small: the matrix products do
    "tiny": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block": 16, "vocab": 32, "batch": 8},
    "small": {"n_layer": 6, "n_embd": 128, "n_head": 4, "block": 64, "vocab": 128,
              "batch": 32},
}
FULL = {"models": ("tiny", "small"), "microbatches": 8, "steps": 10, "stages": (2, 4),
        "rounds": 3}
QUICK = {"models": ("tiny",), "microbatches": 4, "steps": 3, "stages": (2,), "rounds": 1}
EMULATED = Link(alpha=50e-6, bandwidth=1.25e9)  # a 10 Gb/s Ethernet-like link


OPTIONS = (option("--microbatches", type=int, help="micro-batches per step (m)"),
           option("--models", metavar="LIST", help="comma-separated of tiny,small"),
           option("--network", action="store_true",
                  help="also run minidist over an emulated 50 us, 1.25 GB/s network"))


class _Roles:
    def __init__(self, rank: int, world: int):
        self.is_first, self.is_last = rank == 0, rank == world - 1


def _step(sched, roles, x, y) -> None:
    if roles.is_first and roles.is_last:
        sched.step(x, target=y)
    elif roles.is_first:
        sched.step(x)
    elif roles.is_last:
        sched.step(target=y)
    else:
        sched.step()


def _parts(cfg: dict, variant: str, comm) -> list[nn.Module]:
    """This rank's chunks of the GPT: one, or V for the interleaved schedule."""
    p, v = comm.world_size, V if "interleaved" in variant else 1
    parts = split_model(GPT(gpt_config(cfg)), p * v)
    return [parts[c * p + comm.rank] for c in range(v)]


_TORCH = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B",
          "interleaved": "ScheduleInterleaved1F1B"}
_OURS = {"naive": ScheduleNaive, "GPipe": ScheduleGPipe, "1F1B": Schedule1F1B,
         "interleaved": ScheduleInterleaved1F1B}


def _schedule(comm, variant: str, parts: list[nn.Module], m: int):
    """(schedule, what knows this rank's role: is_first, is_last) for this rank."""
    p, v, name = comm.world_size, len(parts), variant.split(" ")[1]
    if variant.startswith("torch"):
        from torch.distributed import pipelining

        stages = [pipelining.PipelineStage(part, c * p + comm.rank, v * p, torch.device("cpu"))
                  for c, part in enumerate(parts)]
        cls = getattr(pipelining, _TORCH[name])
        sched = cls(stages if v > 1 else stages[0], m, loss_fn=lm_loss)
        return sched, _Roles(comm.rank, p)
    stages = [PipelineStage(part, comm, c * p + comm.rank, v * p)
              for c, part in enumerate(parts)]
    sched = _OURS[name](stages if v > 1 else stages[0], 1 if name == "naive" else m, lm_loss)
    return sched, sched


def _run_rank(comm, variant: str, cfg: dict) -> dict:
    """Time ``cfg['steps']`` steps, then trace one (spans and activation memory)."""
    parts = _parts(cfg, variant, comm)
    sched, roles = _schedule(comm, variant, parts, cfg["microbatches"])
    params = [q for part in parts for q in part.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    x, y = synthetic_tokens(1, cfg["batch"], cfg["block"], cfg["vocab"], seed=0)[0]
    times = []
    for i in range(cfg["steps"] + 3):  # three warm-up steps, not counted
        start = time.perf_counter()
        opt.zero_grad()
        _step(sched, roles, x, y)
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - start)
    spans = ModuleSpans(parts, comm.rank) if variant.startswith("torch") else None
    for stage in getattr(sched, "stages", []):
        stage.measure_memory = False  # its own saved-tensor hooks would hide the meter's
    comm.timeline.clear()
    comm.timeline.enable(spans is None)
    comm.barrier()
    opt.zero_grad()
    with LiveSavedBytes({q.data_ptr() for q in params}) as meter:
        _step(sched, roles, x, y)
    comm.timeline.enable(False)
    events = spans.events if spans is not None else comm.timeline.as_dicts()
    return {"step_s": statistics.median(times), "peak_bytes": meter.peak,
            "events": [e for e in events if e["cat"] in ("forward", "backward")]}


def measure(variant: str, stages: int, cfg: dict, network: Network | None = None) -> dict:
    backend = "torch" if variant.startswith("torch") else "local"
    ranks = launch(_run_rank, stages, args=(variant, cfg), backend=backend, network=network,
                   timeout=300)
    m = 1 if "naive" in variant else cfg["microbatches"]
    v = V if "interleaved" in variant else 1
    return {"step_s": max(r["step_s"] for r in ranks),  # as slow as the slowest stage
            "bubble": measured_bubble([r["events"] for r in ranks]),
            "formula": bubble_fraction(stages, m, v), "microbatches": m, "chunks": v,
            "peak_bytes": [r["peak_bytes"] for r in ranks],
            "events": [e for r in ranks for e in r["events"]]}


def _cases(models, stage_counts, network: bool) -> list[tuple[str, int, str, bool]]:
    """Every (model, stages, variant, emulated); interleaved where the GPT has V p layers."""
    cases = []
    for emulated in (False, True) if network else (False,):
        for k in models:
            layers = MODELS[k]["n_layer"] + 2  # GPT.stages(): embedding, blocks, head
            cases += [(k, p, v, emulated) for p in stage_counts for v in VARIANTS
                      if not (emulated and v.startswith("torch"))
                      and not ("interleaved" in v and layers < V * p)]
    return cases


def _measured(cfg: dict) -> list[tuple[dict, partial]]:
    return [(dict(model=model, stages=p, emulated=emulated,
                  variant=variant + (" (emulated)" if emulated else "")),
             partial(measure, variant, p, dict(cfg, **MODELS[model]),
                     Network.uniform(EMULATED) if emulated else None))
            for model, p, variant, emulated in _cases(cfg["models"], cfg["stages"],
                                                      cfg["network"])]


def derive(rows: list[dict], cfg: dict | None = None) -> list[dict]:
    """Add ms, steps/s, the peak activations in MiB and the speed-up over torch."""
    by = {(r["model"], r["stages"], r["variant"]): r for r in rows}
    for r in map(add_speed, rows):
        r["peak_mib"] = " / ".join(f"{b / 2**20:.2f}" for b in r["peak_bytes"])
        name = r["variant"].split(" ")[1]
        theirs = by.get((r["model"], r["stages"], f"torch {name}"))
        mine = theirs and not r["emulated"] and r["variant"] != theirs["variant"]
        r["vs_torch"] = speedup(r, theirs) if mine else None
    return rows


COLUMNS = [("model", "GPT", "s"), ("stages", "stages", "d"), ("variant", "schedule", "s"),
           ("microbatches", "m", "d"), ("chunks", "v", "d"),
           ("ms", "ms/step", ".1f"), ("steps_per_s", "steps/s", ".1f"),
           ("bubble", "bubble (measured)", ".2f"), ("formula", "(p-1)/(vm+p-1)", ".2f"),
           ("peak_mib", "peak activations per stage, MiB", "s"), ("vs_torch", "vs torch", ".2f")]


def _configure(preset: dict, args) -> dict:
    models = args.models.split(",") if args.models else list(preset["models"])
    unknown = [k for k in models if k not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; choose from {sorted(MODELS)}")
    return dict(preset, models=models, microbatches=args.microbatches or preset["microbatches"],
                network=args.network)


def _params(cfg: dict, k: str) -> int:
    return GPT(gpt_config(dict(cfg, **MODELS[k]))).num_params()


def _header(cfg: dict) -> str:
    lines = [f"GPT {k}: {MODELS[k]['n_layer']} layers x {MODELS[k]['n_embd']} "
             f"({_params(cfg, k) / 1e6:.2f} M parameters), batch {MODELS[k]['batch']} x "
             f"{MODELS[k]['block']} tokens" for k in cfg["models"]]
    return "\n".join(lines + [f"m={cfg['microbatches']} micro-batches per step, stages of "
                                "equal layer counts\n"])


NOTES = ("bubble (measured): 1 - busy / (p x span) of one traced step's forward and backward "
         "spans;\n(emulated): minidist over an emulated network, 50 us + bytes / 1.25 GB/s "
         "per message")


def _result(rows: list[dict], cfg: dict) -> dict:
    """The rows without their traced events (the plot's Gantt chart reads those)."""
    models = {k: dict(MODELS[k], parameters=_params(cfg, k)) for k in cfg["models"]}
    return {"config": dict(cfg, models=models),
            "rows": [{k: v for k, v in r.items() if k != "events"} for r in rows]}


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.4))
    groups = list(dict.fromkeys((r["model"], r["stages"]) for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    by = {(r["model"], r["stages"], r["variant"]): r for r in rows}
    width = 0.85 / len(variants)
    for k, variant in enumerate(variants):
        here = [(g, by[g + (variant,)]) for g in groups if g + (variant,) in by]
        xs = [groups.index(g) + (k - (len(variants) - 1) / 2) * width for g, _ in here]
        naive = [by[g + ("minidist naive",)]["steps_per_s"] for g, _ in here]
        style = {"color": f"C{VARIANTS.index(variant.replace(' (emulated)', ''))}",
                 "hatch": "//" if "emulated" in variant else None, "edgecolor": "white"}
        ax1.bar(xs, [r["steps_per_s"] / n for (_, r), n in zip(here, naive)], width,
                label=variant, **style)
        ax2.bar(xs, [100 * r["bubble"] for _, r in here], width, label=variant, **style)
        ax2.hlines([100 * r["formula"] for _, r in here], [x - width / 2 for x in xs],
                   [x + width / 2 for x in xs], colors="k", lw=1.5,
                   label="(p-1)/(vm+p-1)" if k == 0 else None)
    for ax, label, title in ((ax1, "steps/s relative to the naive split",
                              "Training speed (higher is better)"),
                             (ax2, "% of the step idle", "Bubble: measured (bars), formula")):
        ax.set_xticks(range(len(groups)), [f"GPT {m}\n{p} stages" for m, p in groups])
        ax.set(ylabel=label, title=title)
        ax.grid(True, axis="y", alpha=0.3)
    ax1.set_ylim(0, 1.7 * ax1.get_ylim()[1])  # room for the legend above the bars
    ax1.legend(fontsize="x-small", ncol=2, loc="upper left")
    shown = max((r for r in rows if r["variant"] == "minidist 1F1B"),
                key=lambda r: (r["model"] != "tiny", r["stages"]))
    _gantt(ax3, shown["events"],
           f"minidist 1F1B, GPT {shown['model']}, {shown['stages']} stages: one step")
    save_figure(fig, path)


def _gantt(ax, events: list[dict], title: str) -> None:
    """One lane per stage; forwards and backwards in two colours (ms)."""
    colors = {"forward": "tab:blue", "backward": "tab:orange"}
    t0 = min(e["start"] for e in events)
    for cat, color in colors.items():
        mine = [e for e in events if e["cat"] == cat]
        ax.barh([e["rank"] for e in mine], [(e["end"] - e["start"]) * 1e3 for e in mine],
                left=[(e["start"] - t0) * 1e3 for e in mine], height=0.6, color=color,
                edgecolor="black", linewidth=0.3, label=cat)
    ranks = sorted({e["rank"] for e in events})
    ax.set_yticks(ranks, [f"stage {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set(xlabel="time (ms)", title=title)
    ax.legend(fontsize="small", loc="lower right")


SPEC = Bench(
    quick_help="a tiny GPT, few steps (CI)", full=FULL, quick=QUICK,
    lists={"stages": "2,4"}, options=OPTIONS, configure=_configure, cases=_measured,
    derive=derive, columns=COLUMNS, header=_header, notes=NOTES, result=_result, plot=plot,
    summary=(lambda r: r["variant"] == "minidist 1F1B" and r["vs_torch"] is not None,
             "GPT {model}, {stages} stages: minidist 1F1B runs {vs_torch:.2f}x the steps/s of "
             "torch's Schedule1F1B"))
add_arguments, main = SPEC.add_arguments, SPEC.main
