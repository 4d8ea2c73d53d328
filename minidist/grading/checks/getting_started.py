"""Tests of exercise 00: ``ring_shift``, ``ping_pong``, ``fit_alpha_beta`` and
``predict_transfer_time``."""

from __future__ import annotations

import math
import time

import torch

from ..engine.compare import compare
from ..engine.data import pattern
from ..engine.feedback import Mistake, traffic_text
from ..engine.sandbox import COLLECTIVES, FIT, PREDICT, SENDRECV
from ..engine.spec import GradedTest

RING_CASES = [(1, torch.float32), (5, torch.int64), (1000, torch.float64), (0, torch.float32),
              ((3, 4), torch.float32)]


def _label(p, n, dtype) -> str:
    return f"world_size={p}, n={n}, dtype={str(dtype)[6:]}"


def _shift_case(comm, namespace, n, dtype):
    return namespace["ring_shift"](comm, pattern(comm.rank, n, dtype, comm.world_size))


def check_ring_shift(learner) -> str:
    for p in (2, 3, 5):
        labels = [_label(p, n, dtype) for n, dtype in RING_CASES]
        ranks = learner.run_ranks(_shift_case, p, RING_CASES, "ring_shift", labels)
        for k, ((n, dtype), label) in enumerate(zip(RING_CASES, labels)):
            nbytes = pattern(0, n, dtype, p).numel() * dtype.itemsize
            for rank in range(p):
                _check_shifted(rank, p, n, dtype, ranks[rank][k]["value"], label)
                _check_one_message(rank, p, nbytes, ranks[rank][k]["traffic"], label)
    return "right on world sizes 2, 3, 5 with 0 to 1000 elements, one message per rank"


def _check_shifted(rank, p, n, dtype, got, case) -> None:
    left = (rank - 1) % p
    problem = compare(got, pattern(left, n, dtype, p), f"rank {rank}")
    if problem is None:
        return
    whose = [r for r in range(p) if isinstance(got, torch.Tensor) and got.numel() > 0
             and compare(got, pattern(r, n, dtype, p), "") is None]
    hint = (f"; that is the tensor of rank {whose[0]}, but rank {rank} should end with the one "
            f"of its left neighbour, rank {left} = (rank - 1) % world_size" if whose else "")
    raise Mistake(f"with {case}: {problem}{hint}")


def _check_one_message(rank, p, nbytes, traffic, case) -> None:
    right = (rank + 1) % p
    if traffic["messages_to"] != {right: 1} or traffic["bytes_sent"] != nbytes:
        raise Mistake(f"with {case}: rank {rank} sent {traffic_text(traffic)}; a ring shift "
                      f"sends one message of {nbytes} bytes, to the right neighbour rank "
                      f"{right}")


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


LATE = 1.0  # seconds rank 1 starts after rank 0 in the barrier case
PONG_CASES = [  # world size: (nbytes, iters, added latency per send, rank 1 starts late by)
    (2, [(1, 5, 0.0, 0.0), (1 << 20, 3, 0.0, 0.0), (1000, 5, 0.04, 0.0), (1000, 5, 0.0, LATE)]),
    (3, [(1000, 4, 0.0, 0.0)]),
]


def _pong_case(comm, namespace, nbytes, iters, delay, late):
    link = _SlowLink(comm, delay) if delay else comm
    if late and comm.rank == 1:
        time.sleep(late)
    result = namespace["ping_pong"](link, nbytes, iters)
    return result if comm.rank == 0 else None


def _pong_label(p, nbytes, iters, delay, late) -> str:
    if delay:
        return f"a link that adds {delay * 1e3:g} ms to every send, iters={iters}"
    if late:
        return f"rank 1 starting {late:g} s after rank 0, nbytes={nbytes}, iters={iters}"
    return f"world_size={p}, nbytes={nbytes}, iters={iters}"


def check_ping_pong(learner) -> str:
    measured = None
    for p, cases in PONG_CASES:
        labels = [_pong_label(p, *c) for c in cases]
        ranks = learner.run_ranks(_pong_case, p, cases, "ping_pong", labels)
        for k, ((nbytes, iters, delay, late), label) in enumerate(zip(cases, labels)):
            _check_pong_traffic([r[k]["traffic"] for r in ranks], nbytes, iters, label)
            seconds = _check_seconds(ranks[0][k]["value"], label)
            if delay:
                _check_timing(seconds, delay, iters, label)
                measured = seconds
            if late:
                _check_started_together(seconds, late, iters, label)
    return ("right traffic on world sizes 2 and 3, the clock started once both ranks are "
            f"ready, and a link with 40 ms latency measured as {measured * 1e3:.1f} ms")


def _check_pong_traffic(traffics, nbytes, iters, case) -> None:
    for rank, traffic in enumerate(traffics):
        want = {1 - rank: iters} if rank < 2 else {}
        if traffic["messages_to"] != want or \
                traffic["bytes_sent"] != nbytes * iters * (rank < 2):
            expect = (f"{iters} messages of {nbytes} bytes to rank {1 - rank}" if rank < 2
                      else "nothing (only ranks 0 and 1 play)")
            raise Mistake(f"with {case}: rank {rank} sent {traffic_text(traffic)}; expected "
                          f"{expect}. A message of nbytes bytes is "
                          "torch.empty(nbytes, dtype=torch.uint8)")


def _check_seconds(result, case) -> float:
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise Mistake(f"with {case}: rank 0 returned {result!r}, expected the one-way time in "
                      "seconds (a float)")
    if not result > 0:
        raise Mistake(f"with {case}: rank 0 returned {result}, but a time must be positive")
    return float(result)


def _check_started_together(seconds, late, iters, case) -> None:
    if seconds <= 0.3 * late / (2 * iters):
        return
    raise Mistake(f"with {case}: ping_pong reported {seconds * 1e3:.1f} ms one way, but the "
                  f"messages take far less: the clock ran while rank 0 waited for rank 1 to "
                  "start. Start timing once both ranks are ready: call comm.barrier() on every "
                  "rank first")


def _check_timing(seconds, delay, iters, case) -> None:
    if 0.85 * delay <= seconds <= 1.5 * delay:
        return
    ratio = seconds / delay
    if 1.7 <= ratio <= 2.6:
        hint = "that is the round trip: one-way time is half of it"
    elif 0.8 * iters <= ratio <= 1.3 * iters:
        hint = f"that is the time of all {iters} round trips, halved: divide by iters too"
    elif 1.7 * iters <= ratio <= 2.6 * iters:
        hint = f"that is the total of all {iters} round trips: divide by 2 * iters"
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


def check_fit_alpha_beta(learner) -> str:
    calls = [(list(sizes), [alpha + n / beta for n in sizes]) for alpha, beta, sizes in FIT_CASES]
    labels = [f"sizes {sizes} and exact times t = {alpha:g} + n / {beta:g}"
              for alpha, beta, sizes in FIT_CASES]
    noisy_alpha, noisy_beta, noisy_sizes, noisy_seconds = _noisy_sweep()
    calls.append((noisy_sizes, noisy_seconds))
    labels.append("a noisy sweep")
    results = learner.call_each("fit_alpha_beta", calls, labels)
    for (alpha, beta, _), case, got in zip(FIT_CASES, labels, results):
        a, b = _fit(got, case)
        if abs(a - alpha) > 1e-3 * alpha or abs(b - beta) > 1e-3 * beta:
            raise Mistake(f"with {case}: got alpha={a:g}, beta={b:g}, expected alpha={alpha:g} s"
                          f", beta={beta:g} bytes/s; {_fit_hint(a, b, alpha, beta)}")
    alpha, beta = noisy_alpha, noisy_beta
    a, b = _fit(results[-1], "a noisy sweep")
    if not (abs(a - alpha) <= 0.25 * alpha and abs(b - beta) <= 0.1 * beta):
        raise Mistake(
            f"with a sweep from 8 B to 128 MiB measured with 3% noise (alpha={alpha:g} s, "
            f"beta={beta:g} bytes/s): got alpha={a:g}, beta={b:g}. The fit is exact on exact "
            "data, but a plain least-squares fit lets the slowest (largest) messages decide "
            "alpha: their 3% noise is far larger than alpha itself. Minimise the relative "
            "error instead: divide each row of the system, and its time, by that time.")
    return f"recovers alpha and beta from {len(FIT_CASES)} exact sweeps and a noisy one"


def _fit(got, case) -> tuple[float, float]:
    """(alpha, beta) from what fit_alpha_beta returned: a tuple, a list, an array."""
    if isinstance(got, torch.Tensor):
        got = got.flatten().tolist()
    if isinstance(got, (list, tuple)) and len(got) == 2:
        pair = [v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for v in got]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair):
            return float(pair[0]), float(pair[1])
    raise Mistake(f"with {case}: fit_alpha_beta returned {got!r}, expected a tuple "
                  "(alpha, beta)")


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


# -- predict a transfer ----------------------------------------------------------------------
PREDICT_CASES = [  # (nbytes, alpha seconds, beta bytes/s): the first has every term visible
    (1000, 1e-3, 2.5e7), (4 << 20, 8e-6, 2.4e10), (1, 2e-6, 8e9), (0, 1e-5, 1e9),
    (10**9, 0.0, 1.25e10)]


def check_predict_transfer_time(learner) -> str:
    labels = [f"nbytes={n}, alpha={a:g} s, beta={b:g} bytes/s" for n, a, b in PREDICT_CASES]
    results = learner.call_each("predict_transfer_time", list(PREDICT_CASES), labels)
    for (n, a, b), case, got in zip(PREDICT_CASES, labels, results):
        t, want = _number(got, case), a + n / b
        if not math.isclose(t, want, rel_tol=1e-9, abs_tol=1e-15):
            raise Mistake(f"with {case}: got {t:g} s, expected {want:g} s; "
                          f"{_predict_hint(t, n, a, b)}")
    return f"alpha + nbytes / beta in {len(PREDICT_CASES)} cases"


def _number(got, case) -> float:
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise Mistake(f"with {case}: predict_transfer_time returned {got!r:.80}, expected the "
                      "time in seconds (a float)")
    return float(got)


def _predict_hint(t, n, a, b) -> str:
    near = lambda x: math.isclose(t, x, rel_tol=1e-6)  # noqa: E731
    if near(n / b):
        return "the latency alpha is missing: every message pays it, however small"
    if near(a + n * b):
        return "beta is a bandwidth in bytes per second: the size divided by it is seconds"
    if near(a + 8 * n / b):
        return "nbytes and beta are both in bytes: no factor 8"
    if near(2 * (a + n / b)):
        return "that is a round trip: one message, one way, takes alpha + n / beta"
    if near((a + n / b) * 1e6) or near((a + n / b) * 1e3):
        return "return seconds, not micro- or milliseconds"
    return "a message of n bytes takes alpha + n / beta seconds in the alpha-beta model"


TESTS = [
    GradedTest("test_ring_shift", 2, ("ring_shift",), check_ring_shift, (COLLECTIVES, SENDRECV)),
    GradedTest("test_ping_pong", 3, ("ping_pong",), check_ping_pong, (COLLECTIVES,)),
    GradedTest("test_fit_alpha_beta", 2, ("fit_alpha_beta",), check_fit_alpha_beta, (FIT,)),
    GradedTest("test_predict_transfer_time", 1, ("predict_transfer_time",),
               check_predict_transfer_time, (PREDICT,)),
]
