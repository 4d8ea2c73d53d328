"""Data parallelism's costs, as code: one all-reduce of the gradients per step.

With N bytes of gradients on p ranks and links of latency alpha and bandwidth B, a ring
all-reduce (Patarasuk and Yuan 2009) sends 2 (p - 1)/p N per rank and takes
2 (p - 1) alpha + 2 (p - 1)/p N / B (``ring_all_reduce_bytes_per_rank``, ``ring_step_time``;
every path's exact bytes and time are in ``collectives.py``). A parameter server's step
is compared with these (``ps.py``).

In a plan (``dp_time``): after the pipeline's flush, each rank all-reduces the gradients of
its 1/(pp tp) of the model, e Psi / (pp tp) bytes, over its dp group (``Cluster.link``:
ranks pp tp apart), not overlapped with the backward. ZeRO moves the same bytes as
reduce-scatters and all-gathers (a ring all-reduce is one of each); stage 3 gathers the
parameters once more, so its time is the ring's times the collectives per step over two
(``zero.collectives_per_step``: 1.5 for stage 3, 1 otherwise).
"""

from __future__ import annotations

from ..checks import positive_int, positive_number
from . import collectives
from .cluster import PRECISION_BYTES, Cluster
from .plan import Plan
from .transformer import GPTShape
from .zero import collectives_per_step


def ring_all_reduce_bytes_per_rank(world: int, model_bytes: float) -> float:
    """Bytes each rank sends (and receives) in one ring all_reduce: ``2 (p-1)/p * N``."""
    p = positive_int(world, "world")
    return 2 * (p - 1) / p * positive_number(model_bytes, "model_bytes")


def ring_step_time(world: int, model_bytes: float, bandwidth: float,
                   latency: float = 0.0) -> float:
    """Seconds of one ring all_reduce: ``2 (p-1) alpha + 2 (p-1)/p N / B``."""
    p = positive_int(world, "world")
    wire = ring_all_reduce_bytes_per_rank(p, model_bytes) / positive_number(bandwidth,
                                                                              "bandwidth")
    return 2 * (p - 1) * latency + wire


def dp_time(model: GPTShape, cluster: Cluster, plan: Plan) -> float:
    """Seconds of a step's data-parallel gradient traffic (module docstring)."""
    if plan.dp == 1:
        return 0.0
    grads = PRECISION_BYTES[plan.precision] * model.params / (plan.pp * plan.tp)
    link = cluster.link(plan.dp, plan.pp * plan.tp)
    ring = collectives.ring_time(grads, plan.dp, link.alpha, link.bandwidth)
    return ring * sum(collectives_per_step(plan.zero_stage).values()) / 2
