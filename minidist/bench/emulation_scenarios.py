"""The fidelity half of ``minidist bench emulation``: each cluster story, predicted by its
formula and run on virtual time (``md.launch(..., clock="virtual")``, FLOP-model compute).

Every scenario is ``fn(p) -> (predicted, virtual, unit)`` for p ranks; the predictions
come from ``md.costmodel`` (the same functions the lessons and tests use), never from a
run. The programs are small on purpose: virtual time does not depend on how long they take
here, only on what they send and compute.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from ..collectives import all_reduce
from ..costmodel import bubble_fraction
from ..costmodel.collectives import ring_time
from ..costmodel.ps import ps_step_time
from ..faults import maybe_delay, slow_rank
from ..launch import launch
from ..parallel.data import DistributedDataParallel
from ..parallel.param_server import ParameterServer
from ..parallel.pipeline import PipelineStage, Schedule1F1B, measured_bubble
from ..transports.compute import Compute
from ..transports.network import Link, Network

RATE = 1e10  # FLOP/s of the described device
COMPUTE = Compute(flops=RATE, efficiency=1.0)
LINK = Link(alpha=20e-6, bandwidth=1e9, name="8 Gb/s")
D = 64  # width of the layers: a Linear(D, D) forward on b rows is 2 b D^2 FLOPs


def _net(link: Link = LINK) -> Network:
    return Network.uniform(link, compute=COMPUTE)


def _ping_pong(comm, n: int) -> float:
    x = torch.zeros(n, dtype=torch.uint8)
    comm.barrier()
    start = comm.now()
    if comm.rank == 0:
        comm.send(x, 1)
        comm.recv(x, 1)
    elif comm.rank == 1:
        comm.recv(x, 0)
        comm.send(x, 0)
    return comm.now() - start


def ping_pong(p: int):
    n = 1 << 20
    took = launch(_ping_pong, p, args=(n,), network=_net(), clock="virtual")[0]
    return 2 * LINK.time(n), took, "ms"


def _ring(comm, n: int) -> float:
    x = torch.ones(n)
    comm.barrier()
    start = comm.now()
    all_reduce(comm, x, algorithm="ring")
    return comm.now() - start


def ring(p: int):
    n = 1 << 18  # floats
    took = max(launch(_ring, p, args=(n,), network=_net(), clock="virtual"))
    # the collective's agreement check is free on virtual time (NCCL makes none)
    return ring_time(4 * n, p, LINK.alpha, LINK.bandwidth), took, "ms"


def two_nodes(p: int):
    """A flat ring over two nodes runs at the inter-node link's pace."""
    intra, inter = Link(alpha=2e-6, bandwidth=1e11), LINK
    net = Network.cluster(nodes=2, per_node=max(1, p // 2), intra=intra, inter=inter,
                          compute=COMPUTE)
    n = 1 << 20  # floats: the bandwidth term dominates, as on a cluster
    took = max(launch(_ring, p, args=(n,), network=net, clock="virtual"))
    return ring_time(4 * n, p, inter.alpha, inter.bandwidth), took, "ms"


def _incast(comm, n: int) -> float:
    x = torch.zeros(n, dtype=torch.uint8)
    comm.barrier()
    start = comm.now()
    if comm.rank == 0:
        for r in [comm.irecv(torch.empty_like(x), src) for src in range(1, comm.world_size)]:
            r.wait()
    else:
        comm.send(x, 0)
    return comm.now() - start


def incast(p: int):
    """p - 1 senders into one ingress port."""
    n = 1 << 20
    took = launch(_incast, p, args=(n,), network=_net(), clock="virtual")[0]
    return LINK.alpha + (p - 1) * n / LINK.bandwidth, took, "ms"


def _straggling(comm, seconds: float) -> float:
    x = torch.ones(1 << 12)
    comm.barrier()
    for _ in range(3):  # the last step is timed: the steady state
        start = comm.now()
        with slow_rank(comm, rank=comm.world_size - 1, seconds=seconds):
            maybe_delay(comm, "forward")
        all_reduce(comm, x, algorithm="ring")
    return comm.now() - start


def straggler(p: int):
    """One slow rank's delay is added to every rank's step."""
    d = 5e-3
    fast, slow = (max(launch(_straggling, p, args=(s,), network=_net(), clock="virtual"))
                  for s in (0.0, d))
    return d, slow - fast, "ms"


def _ddp(comm, batch: int) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(4)])
    ddp = DistributedDataParallel(model, comm, bucket_cap_mb=0.01, algorithm="ring")
    x = torch.randn(batch, D)
    for _ in range(2):  # the second step is timed
        comm.barrier()
        start = comm.now()
        ddp(x).sum().backward()
    return comm.now() - start


def ddp(p: int):
    """Four layers, a bucket each: forward, then max(backward, the buckets' all-reduces
    from the first one ready) and the last bucket, reduced once backward is over."""
    batch = 340
    layer = 2 * batch * D * D / RATE
    c = ring_time(D * D * 4, p, LINK.alpha, LINK.bandwidth)  # its check: free
    back = 2 * layer
    predicted = 4 * layer + max(3.5 * back, back + 3 * c) + c
    took = max(launch(_ddp, p, args=(batch,), network=_net(), clock="virtual"))
    return predicted, took, "ms"


def _ps(comm, steps: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))
    ps = ParameterServer(comm, model, num_servers=1, mode="sync", lr=0.1)
    if ps.is_server:
        ps.serve()
        return None
    x, pulled = torch.randn(8, 256), []
    for _ in range(steps):
        ps.pull()
        pulled.append(comm.now())
        model(x).pow(2).mean().backward()
        ps.push()
        model.zero_grad()
    ps.close()
    return pulled


def param_server(p: int):
    """One server, p - 1 workers: a step ends when the last worker has its parameters.
    The median step (a step now and then is slower: the workers' pushes meet on the
    server's port at one virtual instant and book it in wall-clock order)."""
    steps, n = 10, (256 * 256 + 256) * 2 * 4
    out = launch(_ps, p, args=(steps,), network=_net(), clock="virtual")
    last = [max(pulls[k] for pulls in out[1:]) for k in range(steps)]
    compute = 5 * 2 * 8 * 256 * 256 / RATE  # forward (2 products), backward (3)
    predicted = compute + ps_step_time(p - 1, n, 1, LINK.bandwidth, LINK.alpha,
                                       pipelined=True)
    return predicted, statistics.median(b - a for a, b in zip(last[1:], last[2:])), "ms"


def _pipeline(comm, m: int):
    torch.manual_seed(comm.rank)
    stage = PipelineStage(nn.Sequential(nn.Linear(D, D), nn.Linear(D, D)), comm)
    sched = Schedule1F1B(stage, n_microbatches=m, loss_fn=lambda y, t: (y - t).pow(2).mean())
    x, y = torch.randn(8 * m, D, requires_grad=True), torch.randn(8 * m, D)
    for _ in range(2):  # the second step is recorded
        comm.timeline.clear()
        if comm.rank == 0:
            sched.step(x)
        elif comm.rank == comm.world_size - 1:
            sched.step(target=y)
        else:
            sched.step()
    return comm.timeline.as_dicts()


def pipeline(p: int):
    """1F1B on p equal stages, m = 8 micro-batches: the bubble (p-1)/(m+p-1)."""
    fast = Network.uniform(Link(alpha=1e-8, bandwidth=1e13), compute=COMPUTE)
    out = launch(_pipeline, p, args=(8,), network=fast, clock="virtual", trace=True)
    return bubble_fraction(p, 8), measured_bubble(out), "share"


SCENARIOS = {"ping-pong": ping_pong, "ring all-reduce": ring, "ring on 2 nodes": two_nodes,
             "incast": incast, "straggler": straggler, "DDP overlap": ddp,
             "sync PS (1 server)": param_server, "1F1B bubble": pipeline}
FORMULAS = {"ping-pong": "2 (alpha + n/B)", "ring all-reduce": "2(p-1)(alpha + n/(pB))",
            "ring on 2 nodes": "the inter link's ring", "incast": "alpha + (p-1) n/B",
            "straggler": "+ delay per step", "DDP overlap": "max(comp, comm) + tail",
            "sync PS (1 server)": "(W/S + 1) N/B", "1F1B bubble": "(p-1)/(m+p-1)"}


def fidelity(world_sizes) -> list[dict]:
    """One row per scenario and world size: predicted, virtual, their ratio."""
    rows = []
    for name, scenario in SCENARIOS.items():
        for p in world_sizes:
            predicted, virtual, unit = scenario(p)
            scale = 1e3 if unit == "ms" else 1.0
            rows.append({"scenario": name, "ranks": p, "formula": FORMULAS[name],
                         "unit": unit, "predicted": predicted * scale,
                         "virtual": virtual * scale, "ratio": virtual / predicted})
    return rows
