"""What runs on the ranks in exercise 00's tests, and the data its checks rebuild: the
ring's test tensors, a link of known latency for the ping-pong, the alpha-beta sweeps."""

from __future__ import annotations

import time

import torch

from ...engine.data import pattern

RING_CASES = [(1, torch.float32), (5, torch.int64), (1000, torch.float64), (0, torch.float32),
              ((3, 4), torch.float32)]
RING_WORLDS = {p: RING_CASES for p in (2, 3, 5)}


def ring_label(p, n, dtype) -> str:
    return f"world_size={p}, n={n}, dtype={str(dtype)[6:]}"


def shift_case(comm, namespace, n, dtype):
    return namespace["ring_shift"](comm, pattern(comm.rank, n, dtype, comm.world_size))


# -- ping-pong --------------------------------------------------------------------------------
class SlowLink:
    """A communicator whose sends each take ``delay`` seconds longer: a link of known latency,
    so that the time a ping-pong reports can be checked."""

    def __init__(self, comm, delay: float):
        self._comm, self._delay = comm, delay

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def send(self, *args, **kwargs):
        time.sleep(self._delay)
        return self._comm.send(*args, **kwargs)

    def isend(self, *args, **kwargs):
        time.sleep(self._delay)
        return self._comm.isend(*args, **kwargs)

    def sendrecv(self, *args, **kwargs):
        time.sleep(self._delay)
        return self._comm.sendrecv(*args, **kwargs)


LATE = 1.0  # seconds rank 1 starts after rank 0 in the barrier case
PONG_WORLDS = {  # world size: (nbytes, iters, added latency per send, rank 1 starts late by)
    2: [(1, 5, 0.0, 0.0), (1 << 20, 3, 0.0, 0.0), (1000, 5, 0.04, 0.0), (1000, 5, 0.0, LATE)],
    3: [(1000, 4, 0.0, 0.0)],
}


def pong_case(comm, namespace, nbytes, iters, delay, late):
    link = SlowLink(comm, delay) if delay else comm
    if late and comm.rank == 1:
        time.sleep(late)
    result = namespace["ping_pong"](link, nbytes, iters)
    return result if comm.rank == 0 else None


def pong_label(p, nbytes, iters, delay, late) -> str:
    if delay:
        return f"a link that adds {delay * 1e3:g} ms to every send, iters={iters}"
    if late:
        return f"rank 1 starting {late:g} s after rank 0, nbytes={nbytes}, iters={iters}"
    return f"world_size={p}, nbytes={nbytes}, iters={iters}"


# -- alpha-beta -------------------------------------------------------------------------------
FIT_CASES = [  # (alpha seconds, beta bytes/s, sizes)
    (2e-6, 8e9, [8, 1024, 65536, 1 << 20, 16 << 20]),
    (3e-5, 1.2e9, [100, 10_000, 1_000_000, 5_000_000]),
    (1e-3, 2.5e7, [1, 2, 3, 1000, 250_000]),
]


def noisy_sweep():
    """Times of a 5 us, 10 GB/s link from 8 B to 128 MiB, each off by up to 3% (seeded)."""
    alpha, beta = 5e-6, 1e10
    sizes = [8 << (3 * k) for k in range(9)]
    noise = torch.Generator().manual_seed(5)
    factors = 1 + 0.03 * (2 * torch.rand(len(sizes), generator=noise, dtype=torch.float64) - 1)
    return alpha, beta, sizes, [(alpha + n / beta) * float(f) for n, f in zip(sizes, factors)]


PREDICT_CASES = [  # (nbytes, alpha seconds, beta bytes/s): the first has every term visible
    (1000, 1e-3, 2.5e7), (4 << 20, 8e-6, 2.4e10), (1, 2e-6, 8e9), (0, 1e-5, 1e9),
    (10**9, 0.0, 1.25e10)]
