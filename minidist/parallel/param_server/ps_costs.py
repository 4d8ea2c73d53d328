"""What a synchronous step costs on a parameter server, against ring all_reduce, as code.

N is the model's size in bytes, W the number of workers, S the number of servers, each rank
with one full-duplex link of bandwidth B (bytes/s) and latency alpha (s). In a sync step
every worker pushes N bytes (N/S to each server) and pulls N bytes back, so

    server ingress per step = W * N / S        (and the same egress for the pulls)
    ring all_reduce, per rank = 2 (W - 1) / W * N   (Patarasuk and Yuan 2009)

The server's link receives W/S model copies per step while a ring rank's receives fewer than
two, whatever W. In time, a sync step's push and pull are sequential phases of W N/(S B)
each on the server's link, against the ring's two phases of (W-1)/W N/B: one server is
about W times slower on the wire (W^2/(W-1) exactly), and S servers divide that by S, up to
S = W where each server's link is no busier than a worker's. The step time (communication
only; a worker's own link carries N each way, which binds when S > W), with push and pull
in sequence:

    t_ps   = 2 (alpha + max(W / S, 1) * N / B)
    t_ring = 2 (W - 1) alpha + 2 (W - 1) / W * N / B

In sync training the server's two directions overlap: the worker that got its parameters
first computes and pushes while the server is still sending to the others, so a step takes
one pass of the busiest link plus one model's worth for the first worker's pull
(``pipelined=True``), which is what ``minidist bench ps`` measures on the emulated network:

    t_ps (pipelined) = 2 alpha + (max(W / S, 1) + 1) * N / B

(Li et al. 2014 discuss the server bottleneck; Sergeev and Del Balso, "Horovod", 2018,
measured it and moved to ring all_reduce; BytePS, Jiang et al. OSDI 2020, showed that
enough servers on spare machines bring the parameter server back to the optimum.)
"""

from __future__ import annotations

import numbers


def _positive(value, what: str, integer: bool = False) -> float:
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ValueError(f"{what} must be a positive {'integer' if integer else 'number'}, "
                         f"got {value!r}")
    return value


def ps_server_ingress_bytes(workers: int, model_bytes: float, num_servers: int = 1) -> float:
    """Bytes into one server per sync step: ``W * N / S``."""
    w = _positive(workers, "workers", integer=True)
    s = _positive(num_servers, "num_servers", integer=True)
    return w * _positive(model_bytes, "model_bytes") / s


def ring_all_reduce_bytes_per_rank(world: int, model_bytes: float) -> float:
    """Bytes each rank sends (and receives) in one ring all_reduce: ``2 (p-1)/p * N``."""
    p = _positive(world, "world", integer=True)
    return 2 * (p - 1) / p * _positive(model_bytes, "model_bytes")


def ps_step_time(workers: int, model_bytes: float, num_servers: int, bandwidth: float,
                 latency: float = 0.0, pipelined: bool = False) -> float:
    """Seconds of communication per sync step, limited by the busier of a server's link
    (W*N/S) and a worker's (N): push then pull, ``2 (alpha + max(W/S, 1) N / B)``; or, with
    ``pipelined``, pushes overlapping the other workers' pulls,
    ``2 alpha + (max(W/S, 1) + 1) N / B``."""
    ingress = ps_server_ingress_bytes(workers, model_bytes, num_servers)
    busiest = max(ingress, float(model_bytes))
    bw = _positive(bandwidth, "bandwidth")
    if pipelined:
        return 2 * latency + (busiest + model_bytes) / bw
    return 2 * (latency + busiest / bw)


def ring_step_time(world: int, model_bytes: float, bandwidth: float,
                   latency: float = 0.0) -> float:
    """Seconds of one ring all_reduce: ``2 (p-1) alpha + 2 (p-1)/p N / B``."""
    p = _positive(world, "world", integer=True)
    wire = ring_all_reduce_bytes_per_rank(p, model_bytes) / _positive(bandwidth, "bandwidth")
    return 2 * (p - 1) * latency + wire
