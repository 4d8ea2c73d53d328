"""What a synchronous step costs on a parameter server, against ring all_reduce, as code.

N is the model's size in bytes, W the number of workers, S the number of servers, each rank
with one full-duplex link of bandwidth B (bytes/s) and latency alpha (s). In a sync step
every worker pushes N bytes (N/S to each server) and pulls N bytes back, so

    server ingress per step = W * N / S        (and the same egress for the pulls)
    ring all_reduce, per rank = 2 (W - 1) / W * N   (Patarasuk and Yuan 2009; ``dp.py``)

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

from ..checks import positive_int, positive_number


def ps_server_ingress_bytes(workers: int, model_bytes: float, num_servers: int = 1) -> float:
    """Bytes into one server per sync step: ``W * N / S``."""
    w = positive_int(workers, "workers")
    s = positive_int(num_servers, "num_servers")
    return w * positive_number(model_bytes, "model_bytes") / s


def ps_step_time(workers: int, model_bytes: float, num_servers: int, bandwidth: float,
                 latency: float = 0.0, pipelined: bool = False) -> float:
    """Seconds of communication per sync step, limited by the busier of a server's link
    (W*N/S) and a worker's (N): push then pull, ``2 (alpha + max(W/S, 1) N / B)``; or, with
    ``pipelined``, pushes overlapping the other workers' pulls,
    ``2 alpha + (max(W/S, 1) + 1) N / B``."""
    ingress = ps_server_ingress_bytes(workers, model_bytes, num_servers)
    busiest = max(ingress, float(model_bytes))
    bw = positive_number(bandwidth, "bandwidth")
    if pipelined:
        return 2 * latency + (busiest + model_bytes) / bw
    return 2 * (latency + busiest / bw)
