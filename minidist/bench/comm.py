"""``minidist bench comm``: communication efficiency: topology-aware all_reduce, compression.

Two halves in one run (``--only topology|compression`` runs one):

**Topology** (this module). Flat ring, binomial tree and hierarchical all_reduce (reduce-
scatter inside each node, ring across nodes, all-gather inside: ``collectives/
hierarchical.py``) of float32 tensors of a few sizes, on ``nodes x per_node`` ranks (2 x 4;
quick mode 2 x 2):

1. *the emulated cluster* (``md.Network.cluster``, ``transports/emulated.py``): links of
   8 Gb/s (10 µs) inside a node and 1 Gb/s (80 µs) between nodes, 8x slower. The links are
   slow on purpose, as in ``bench ddp`` and ``bench ps``: this machine must move the bytes
   and reduce them faster than the links would, with 8 ranks on 2 cores, or the figures
   show its cores rather than the links. Per row: ms per call, the time predicted by
   ``cluster_costs.cluster_time`` (each round pays its slowest hop), the speed-up over
   the flat ring, and the bytes that crossed nodes in one call, summed over ranks and
   counted by ``comm.stats`` per peer, beside the prediction (``cross_node_bytes``).
   Then the same cluster with ranks placed round-robin (rank r on node r % nodes): the ring
   in rank order crosses nodes at every hop, ``topology_ring`` (node order) at one per node.
2. *this machine* (local backend, shared memory, every link the same; the layout is only
   pretended, ``md.Topology(comm, node_of=...)``): the same algorithms, and torch's own
   ``torch.distributed.all_reduce`` on gloo as the real system's figure.

Each row is its best of ``--rounds`` interleaved rounds (``timing.best_of_rounds``); a round
times ``ITERS`` calls, each one from a barrier, and keeps the median of the slowest rank's
times. Goal (issue 16): hierarchical at least 1.5x the flat ring on the emulated 2-node
cluster with an 8x slower inter-node link; the verdict is printed, met or not.

**Compression** (``bench/comm_compression.py``, when present): DDP with no hook, fp16, top-k,
PowerSGD and local SGD against torch's hooks; its options start with ``--ddp-``.
``--json PATH`` writes ``{"topology": ..., "compression": ...}``; ``--plot PATH`` draws
three topology panels and the two of compression.
"""

from __future__ import annotations

import importlib
import statistics
import time
from functools import partial

import torch

from ..checks import int_list
from ..collectives import all_reduce
from ..collectives.topology import Topology, topology_of
from ..costmodel import cluster as cluster_costs
from ..launch import launch
from ..notebook import quick_mode
from ..transports.network import Link, Network
from .spec import Bench, option
from .timing import human_bytes, pyplot, save_figure, save_json

INTRA = Link(alpha=10e-6, bandwidth=1e9, name="8 Gb/s (emulated)")
INTER = Link(alpha=80e-6, bandwidth=125e6, name="1 Gb/s (emulated)")
ALGORITHMS = ("ring", "tree", "hierarchical")
FULL = {"nodes": 2, "per_node": 4, "sizes": (64 << 10, 1 << 20, 8 << 20, 32 << 20),
        "rounds": 3, "iters": 4}
QUICK = {"nodes": 2, "per_node": 2, "sizes": (64 << 10, 1 << 20), "rounds": 1, "iters": 2}
GOAL = 1.5


OPTIONS = (option("--only", choices=("topology", "compression"), help="run one half only"),
           option("--sizes", metavar="LIST", help="bytes, comma-separated"))


def add_arguments(parser) -> None:
    TOPOLOGY.add_arguments(parser)
    compression = _compression()
    if compression is not None:
        compression.add_arguments(parser)


def _compression():
    """The compression half, or None where it is not installed."""
    try:
        return importlib.import_module("minidist.bench.comm_compression")
    except ModuleNotFoundError as e:
        if e.name != "minidist.bench.comm_compression":
            raise
        return None


# -- one case -----------------------------------------------------------------------------
def _rank(comm, algorithm: str, nbytes: int, iters: int, layout: list[int] | None) -> dict:
    """Time ``iters`` all_reduces from a barrier each; bytes sent across nodes in the last."""
    if layout is not None and algorithm != "gloo":  # this machine: a pretended layout
        comm.topology = Topology(comm, layout)
    x = torch.ones(nbytes // 4)
    call = _gloo if algorithm == "gloo" else partial(all_reduce, algorithm=algorithm)
    call(comm, x)  # warm-up: sub-communicators, first touch of the buffers
    times = []
    for _ in range(iters):
        comm.barrier()
        comm.stats.reset()
        start = time.perf_counter()
        call(comm, x)
        times.append(time.perf_counter() - start)
    if algorithm == "gloo":
        return {"times": times, "across": None}
    topo = topology_of(comm)
    across = sum(s.bytes_sent for q, s in comm.stats.per_peer.items()
                 if topo.node_of[q] != topo.node)
    return {"times": times, "across": across}


def _gloo(comm, x):
    import torch.distributed as dist

    dist.all_reduce(x, group=comm.capability("process_group"))


def run_case(where: str, placement: str, algorithm: str, nbytes: int, cfg: dict) -> dict:
    """One launch; ``step_s``: the median over calls of the slowest rank's time."""
    p = cfg["nodes"] * cfg["per_node"]
    kw = {"backend": "torch"} if algorithm == "gloo" else {}
    layout = None
    if where == "emulated":
        kw["network"] = Network.cluster(cfg["nodes"], cfg["per_node"], INTRA, INTER,
                                        placement=placement)
    else:
        layout = cluster_costs.block_layout(cfg["nodes"], cfg["per_node"])
    out = launch(_rank, p, args=(algorithm, nbytes, cfg["iters"], layout), timeout=300, **kw)
    slowest = [max(call) for call in zip(*(o["times"] for o in out))]
    across = None if out[0]["across"] is None else sum(o["across"] for o in out)
    return {"step_s": statistics.median(slowest), "across": across}


def _cases(cfg: dict) -> list[tuple[dict, object]]:
    cases = []
    for n in cfg["sizes"]:
        for where, algos in (("emulated", ALGORITHMS), ("this machine", ALGORITHMS + ("gloo",))):
            cases += [({"where": where, "placement": "block", "algorithm": a, "bytes": n},
                       partial(run_case, where, "block", a, n, cfg)) for a in algos]
    n = cfg["sizes"][-1]
    cases += [({"where": "emulated", "placement": "round_robin", "algorithm": a, "bytes": n},
               partial(run_case, "emulated", "round_robin", a, n, cfg))
              for a in ("ring", "topology_ring", "hierarchical")]
    return cases


def derive(rows: list[dict], cfg: dict) -> list[dict]:
    """Add ms, the predictions (emulated rows), and the speed-up over the flat ring."""
    ring = {(r["where"], r["placement"], r["bytes"]): r["step_s"] for r in rows
            if r["algorithm"] == "ring"}
    p = cfg["nodes"] * cfg["per_node"]
    for r in rows:
        r["ms"] = r["step_s"] * 1e3
        r["vs_ring"] = ring[r["where"], r["placement"], r["bytes"]] / r["step_s"]
        r["predicted_ms"] = r["predicted_across"] = None
        if r["where"] == "emulated":
            net = Network.cluster(cfg["nodes"], cfg["per_node"], INTRA, INTER,
                                  placement=r["placement"])
            layout = [net.node_of(q) for q in range(p)]
            r["predicted_ms"] = 1e3 * cluster_costs.cluster_time(
                r["algorithm"], r["bytes"], layout, INTRA, INTER)
            r["predicted_across"] = cluster_costs.cross_node_bytes(r["algorithm"], r["bytes"],
                                                                   layout)
    return rows


COLUMNS = [("where", "where", "s"), ("placement", "placement", "s"),
           ("algorithm", "algorithm", "s"), ("bytes", "size", "bytes"), ("ms", "ms", ".2f"),
           ("predicted_ms", "predicted ms", ".2f"), ("vs_ring", "vs ring", ".2f"),
           ("across", "bytes across nodes", ",.0f"),
           ("predicted_across", "predicted", ",.0f")]


def goal(rows: list[dict]) -> dict:
    """Hierarchical's speed-up over the flat ring on the emulated cluster, by size."""
    speedups = {r["bytes"]: r["vs_ring"] for r in rows if r["where"] == "emulated"
                and r["placement"] == "block" and r["algorithm"] == "hierarchical"}
    best = max(speedups.values())
    return {"hierarchical_vs_ring": speedups, "best": best, "met": best >= GOAL}


def _header(cfg: dict) -> str:
    return (f"Topology: {cfg['nodes']} nodes x {cfg['per_node']} ranks; emulated links "
            f"{INTRA!r} inside a node, {INTER!r} between nodes; best of {cfg['rounds']} "
            f"rounds of {cfg['iters']} calls\n")


def _notes(rows: list[dict], cfg: dict) -> str:
    g = goal(rows)
    by_size = ", ".join(f"{human_bytes(n)}: {s:.2f}x" for n, s in g["hierarchical_vs_ring"].items())
    return (f"Goal: hierarchical at least {GOAL}x the flat ring on the emulated 2-node "
            f"cluster (8x slower inter-node link): {by_size} ({'met' if g['met'] else 'NOT met'}"
            f"). 'this machine' rows share one memory: no slow link, so no gain to expect.")


def _configure(preset: dict, args) -> dict:
    cfg = dict(preset, quick=bool(getattr(args, "quick", False)) or quick_mode())
    if getattr(args, "sizes", None):
        cfg["sizes"] = tuple(int_list(args.sizes, "--sizes (bytes)"))
        if any(s < 4 for s in cfg["sizes"]):
            raise ValueError(f"--sizes must be >= 4 bytes (one float32), got {args.sizes!r}")
    return cfg


def _result(rows: list[dict], cfg: dict) -> dict:
    return {"config": cfg, "links": {"intra": repr(INTRA), "inter": repr(INTER)},
            "rows": rows, "goal": goal(rows)}


def measure(args) -> dict:
    """Run the topology half, print its table and the goal; return the JSON-able result."""
    return TOPOLOGY.measure_and_report(args)[1]


def main(args) -> dict:
    result = {}
    if args.only in (None, "topology"):
        result["topology"] = measure(args)
    compression = _compression()
    if args.only in (None, "compression"):
        if compression is None:
            print("\n(compression half not installed: minidist.bench.comm_compression)")
        else:
            print()
            result["compression"] = compression.measure(args)
    if args.json:
        save_json(args.json, result)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(result, args.plot, compression)
        print(f"wrote {args.plot}")
    return result


def plot(result: dict, path: str, compression=None) -> None:
    plt = pyplot()
    halves = [h for h in ("topology", "compression") if h in result]
    fig, grid = plt.subplots(len(halves), 3, figsize=(16.5, 4.4 * len(halves)), squeeze=False)
    for axes, half in zip(grid, halves):  # one row per half: 3 panels, then 2 and a blank
        if half == "topology":
            plot_topology(result["topology"], axes)
        else:
            compression.plot(result["compression"], axes[:2])
            axes[2].set_axis_off()
    save_figure(fig, path)
    plt.close(fig)


def plot_topology(result: dict, axes) -> None:
    """axes[0]: emulated ms against size, measured and predicted; axes[1]: this machine;
    axes[2]: bytes across nodes per call at the largest size."""
    rows = result["rows"]
    for ax, where in zip(axes[:2], ("emulated", "this machine")):
        mine = [r for r in rows if r["where"] == where and r["placement"] == "block"]
        for k, algo in enumerate(dict.fromkeys(r["algorithm"] for r in mine)):
            rs = [r for r in mine if r["algorithm"] == algo]
            ax.plot([r["bytes"] for r in rs], [r["ms"] for r in rs], "o-", color=f"C{k}",
                    label=f"{algo} (measured)")
            if rs[0]["predicted_ms"] is not None:
                ax.plot([r["bytes"] for r in rs], [r["predicted_ms"] for r in rs], "--",
                        color=f"C{k}", label=f"{algo} (predicted)")
        shape = f"{result['config']['nodes']} x {result['config']['per_node']} ranks"
        ax.set(xscale="log", yscale="log", xlabel="tensor size (bytes, log scale)",
               ylabel="ms per all_reduce (log scale)",
               title=f"emulated cluster, {shape}, inter link 8x slower" if where == "emulated"
               else f"this machine, {shape} (nodes pretended)")
        ax.legend(fontsize="x-small")
    big = [r for r in rows if r["where"] == "emulated" and r["across"] is not None
           and r["bytes"] == max(r2["bytes"] for r2 in rows)]
    labels = [f"{r['algorithm']}\n{r['placement']}" for r in big]
    xs = range(len(big))
    axes[2].bar([x - 0.2 for x in xs], [r["across"] / 1e6 for r in big], 0.4, label="measured")
    axes[2].bar([x + 0.2 for x in xs], [r["predicted_across"] / 1e6 for r in big], 0.4,
                label="predicted")
    axes[2].set_xticks(list(xs), labels, fontsize="x-small")
    axes[2].set(ylabel="MB across nodes per call (all ranks)",
                title=f"Inter-node bytes, {human_bytes(big[0]['bytes'])} tensor")
    axes[2].legend(fontsize="small")


TOPOLOGY = Bench(
    quick_help="2 x 2 ranks, two sizes (CI)", full=FULL, quick=QUICK, options=OPTIONS,
    configure=_configure, cases=_cases, derive=derive, columns=COLUMNS, header=_header,
    notes=_notes, result=_result)  # main draws --plot: both halves in one figure
