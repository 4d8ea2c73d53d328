"""Tests of exercise 00: ``ring_shift``, ``ping_pong`` and ``fit_alpha_beta``."""

from __future__ import annotations

import time

import torch

from ..feedback import Mistake, compare
from ..registry import GradedTest
from .harness import pattern, run_ranks, stats_of

RING_CASES = [(1, torch.float32), (5, torch.int64), (1000, torch.float64), (0, torch.float32)]


def _ring_shift_body(comm, ring_shift, cases):
    out = []
    for n, dtype in cases:
        comm.stats.reset()
        got = ring_shift(comm, pattern(comm.rank, n, dtype, comm.world_size))
        out.append((got, stats_of(comm)))
    return out


def check_ring_shift(ring_shift) -> str:
    for p in (2, 3, 5):
        ranks = run_ranks(_ring_shift_body, p, (ring_shift, RING_CASES), "ring_shift",
                          f"world_size={p}")
        for (n, dtype), results in zip(RING_CASES, zip(*ranks)):
            case = f"world_size={p}, n={n}, dtype={str(dtype)[6:]}"
            for rank, (got, stats) in enumerate(results):
                _check_shifted(rank, p, n, dtype, got, case)
                _check_one_message(rank, p, n * dtype.itemsize, stats, case)
    return "right on world sizes 2, 3, 5 with 0 to 1000 elements, one message per rank"


def _check_shifted(rank, p, n, dtype, got, case) -> None:
    left = (rank - 1) % p
    problem = compare(got, pattern(left, n, dtype, p), f"rank {rank}")
    if problem is None:
        return
    whose = [r for r in range(p) if isinstance(got, torch.Tensor) and n > 0
             and compare(got, pattern(r, n, dtype, p), "") is None]
    hint = (f"; that is the tensor of rank {whose[0]}, but rank {rank} should end with the one "
            f"of its left neighbour, rank {left} = (rank - 1) % world_size" if whose else "")
    raise Mistake(f"with {case}: {problem}{hint}")


def _check_one_message(rank, p, nbytes, stats, case) -> None:
    right = (rank + 1) % p
    if stats["messages_to"] != {right: 1} or stats["bytes_sent"] != nbytes:
        raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; a ring shift sends "
                      f"one message of {nbytes} bytes, to the right neighbour rank {right}")


def _traffic(stats) -> str:
    if not stats["messages_to"]:
        return "nothing"
    return ", ".join(f"{m} message(s), {stats['sent_to'][p]} bytes to rank {p}"
                     for p, m in sorted(stats["messages_to"].items()))


# -- ping-pong --------------------------------------------------------------------------------
class _SlowLink:
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


def _ping_pong_body(comm, ping_pong, nbytes, iters, delay):
    link = _SlowLink(comm, delay) if delay else comm
    result = ping_pong(link, nbytes, iters)
    if comm.rank == 0:
        result = float(result) if isinstance(result, (int, float, torch.Tensor)) else result
    else:
        result = None
    return result, stats_of(comm)


def check_ping_pong(ping_pong) -> str:
    for p, nbytes, iters in ((2, 1, 5), (2, 1 << 20, 3), (3, 1000, 4)):
        case = f"world_size={p}, nbytes={nbytes}, iters={iters}"
        ranks = run_ranks(_ping_pong_body, p, (ping_pong, nbytes, iters, 0.0), "ping_pong", case)
        _check_pong_traffic(ranks, nbytes, iters, case)
        _check_seconds(ranks[0][0], case)
    delay, iters = 0.04, 3
    case = f"a link that adds {delay * 1e3:g} ms to every send, iters={iters}"
    ranks = run_ranks(_ping_pong_body, 2, (ping_pong, 1000, iters, delay), "ping_pong", case)
    _check_timing(ranks[0][0], delay, iters, case)
    return ("right traffic on world sizes 2 and 3, and the one-way time of a link with "
            f"{delay * 1e3:g} ms latency measured as {ranks[0][0] * 1e3:.1f} ms")


def _check_pong_traffic(ranks, nbytes, iters, case) -> None:
    for rank, (_, stats) in enumerate(ranks):
        want = {1 - rank: iters} if rank < 2 else {}
        if stats["messages_to"] != want or stats["bytes_sent"] != nbytes * iters * (rank < 2):
            expect = (f"{iters} messages of {nbytes} bytes to rank {1 - rank}" if rank < 2
                      else "nothing (only ranks 0 and 1 play)")
            raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; expected {expect}."
                          " A message of nbytes bytes is torch.empty(nbytes, dtype=torch.uint8)")


def _check_seconds(result, case) -> None:
    if not isinstance(result, float):
        raise Mistake(f"with {case}: rank 0 returned {type(result).__name__}, expected the "
                      "one-way time in seconds (a float)")
    if not result > 0:
        raise Mistake(f"with {case}: rank 0 returned {result}, but a time must be positive")


def _check_timing(seconds, delay, iters, case) -> None:
    if 0.85 * delay <= seconds <= 1.5 * delay:
        return
    ratio = seconds / delay
    if 1.7 <= ratio <= 2.6:
        hint = "that is the round trip: one-way time is half of it"
    elif ratio >= 1.7 * iters:
        hint = f"that looks like the total of all {iters} round trips: divide by iters too"
    elif ratio < 0.85:
        hint = "too short: time the whole loop, from before the first send to after the last recv"
    else:
        hint = "expected about the added latency: mean round-trip time / 2"
    raise Mistake(f"with {case}: ping_pong reported {seconds * 1e3:.1f} ms one way, expected "
                  f"about {delay * 1e3:g} ms; {hint}")


# -- alpha-beta fit -------------------------------------------------------------------------
FIT_CASES = [  # (alpha seconds, beta bytes/s, sizes)
    (2e-6, 8e9, [8, 1024, 65536, 1 << 20, 16 << 20]),
    (3e-5, 1.2e9, [100, 10_000, 1_000_000, 5_000_000]),
    (1e-3, 2.5e7, [1, 2, 3, 1000, 250_000]),
]


def check_fit_alpha_beta(fit_alpha_beta) -> str:
    for alpha, beta, sizes in FIT_CASES:
        seconds = [alpha + n / beta for n in sizes]
        case = f"sizes {sizes} and exact times t = {alpha:g} + n / {beta:g}"
        a, b = _fit(fit_alpha_beta, sizes, seconds, case)
        if abs(a - alpha) > 1e-3 * alpha or abs(b - beta) > 1e-3 * beta:
            raise Mistake(f"with {case}: got alpha={a:g}, beta={b:g}, expected alpha={alpha:g} s"
                          f", beta={beta:g} bytes/s; {_fit_hint(a, b, alpha, beta)}")
    alpha, beta, sizes, seconds = _noisy_sweep()
    a, b = _fit(fit_alpha_beta, sizes, seconds, "a noisy sweep")
    if not (abs(a - alpha) <= 0.25 * alpha and abs(b - beta) <= 0.1 * beta):
        raise Mistake(
            f"with a sweep from 8 B to 128 MiB measured with 3% noise (alpha={alpha:g} s, "
            f"beta={beta:g} bytes/s): got alpha={a:g}, beta={b:g}. The fit is exact on exact "
            "data, but a plain least-squares fit lets the slowest (largest) messages decide "
            "alpha: their 3% noise is far larger than alpha itself. Minimise the relative "
            "error instead: divide each row of the system, and its time, by that time.")
    return f"recovers alpha and beta from {len(FIT_CASES)} exact sweeps and a noisy one"


def _fit(fit_alpha_beta, sizes, seconds, case) -> tuple[float, float]:
    got = fit_alpha_beta(list(sizes), list(seconds))
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Mistake(f"with {case}: fit_alpha_beta returned {got!r}, expected a tuple "
                      "(alpha, beta)")
    return float(got[0]), float(got[1])


def _noisy_sweep():
    """Times of a 5 us, 10 GB/s link from 8 B to 128 MiB, each off by up to 3% (seeded)."""
    alpha, beta = 5e-6, 1e10
    sizes = [8 << (3 * k) for k in range(9)]
    noise = torch.Generator().manual_seed(5)
    factors = 1 + 0.03 * (2 * torch.rand(len(sizes), generator=noise, dtype=torch.float64) - 1)
    return alpha, beta, sizes, [(alpha + n / beta) * float(f) for n, f in zip(sizes, factors)]


def _fit_hint(a, b, alpha, beta) -> str:
    near = lambda x, y: y != 0 and abs(x - y) <= 1e-3 * abs(y)  # noqa: E731
    if near(a, beta) and near(b, alpha):
        return "alpha and beta are swapped"
    if near(b, 1 / beta):
        return "beta is the bandwidth (bytes per second), the inverse of the fitted slope"
    if near(b, beta / 1e9) or near(a, alpha * 1e6):
        return "keep SI units: seconds and bytes per second"
    return "fit t = alpha + n / beta by least squares: np.linalg.lstsq on the columns [1, n]"


TESTS = [
    GradedTest("test_ring_shift", 2, ("ring_shift",), check_ring_shift),
    GradedTest("test_ping_pong", 3, ("ping_pong",), check_ping_pong),
    GradedTest("test_fit_alpha_beta", 2, ("fit_alpha_beta",), check_fit_alpha_beta),
]
