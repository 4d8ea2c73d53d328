"""Exercise 00's tests: the ring shift's values and its one message per rank, the
ping-pong's one-way time on a link of known latency (and with a late rank), the alpha-beta
fit on exact and noisy sweeps, and the predicted transfer time."""

from __future__ import annotations

import math

import torch

from ...engine.compare import compare
from ...engine.data import pattern
from ...engine.feedback import Mistake, traffic_text
from .mistakes import fit_hint, predict_hint, timing_hint
from .ranks import (
    FIT_CASES,
    PONG_WORLDS,
    PREDICT_CASES,
    RING_WORLDS,
    noisy_sweep,
    pong_case,
    pong_label,
    ring_label,
    shift_case,
)


def check_ring_shift(learner) -> str:
    for p, (n, dtype), label, results in learner.each_world(shift_case, "ring_shift",
                                                            RING_WORLDS, ring_label):
        nbytes = pattern(0, n, dtype, p).numel() * dtype.itemsize
        for rank, result in enumerate(results):
            _check_shifted(rank, p, n, dtype, result["value"], label)
            _check_one_message(rank, p, nbytes, result["traffic"], label)
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
def check_ping_pong(learner) -> str:
    measured = None
    for _, (nbytes, iters, delay, late), label, results in learner.each_world(
            pong_case, "ping_pong", PONG_WORLDS, pong_label):
        _check_pong_traffic([r["traffic"] for r in results], nbytes, iters, label)
        seconds = _check_seconds(results[0]["value"], label)
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
    raise Mistake(f"with {case}: ping_pong reported {seconds * 1e3:.1f} ms one way, expected "
                  f"about {delay * 1e3:g} ms; {timing_hint(seconds / delay, iters)}")


# -- alpha-beta fit -------------------------------------------------------------------------
def check_fit_alpha_beta(learner) -> str:
    calls = [(list(sizes), [alpha + n / beta for n in sizes]) for alpha, beta, sizes in FIT_CASES]
    labels = [f"sizes {sizes} and exact times t = {alpha:g} + n / {beta:g}"
              for alpha, beta, sizes in FIT_CASES]
    noisy_alpha, noisy_beta, noisy_sizes, noisy_seconds = noisy_sweep()
    calls.append((noisy_sizes, noisy_seconds))
    labels.append("a noisy sweep")
    results = learner.call_each("fit_alpha_beta", calls, labels)
    for (alpha, beta, _), case, got in zip(FIT_CASES, labels, results):
        a, b = _fit(got, case)
        if abs(a - alpha) > 1e-3 * alpha or abs(b - beta) > 1e-3 * beta:
            raise Mistake(f"with {case}: got alpha={a:g}, beta={b:g}, expected alpha={alpha:g} s"
                          f", beta={beta:g} bytes/s; {fit_hint(a, b, alpha, beta)}")
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


# -- predict a transfer ----------------------------------------------------------------------
def check_predict_transfer_time(learner) -> str:
    labels = [f"nbytes={n}, alpha={a:g} s, beta={b:g} bytes/s" for n, a, b in PREDICT_CASES]
    results = learner.call_each("predict_transfer_time", list(PREDICT_CASES), labels)
    times = [_number(got, case) for case, got in zip(labels, results)]
    for (n, a, b), case, t in zip(PREDICT_CASES, labels, times):
        want = a + n / b
        if not math.isclose(t, want, rel_tol=1e-9, abs_tol=1e-15):
            raise Mistake(f"with {case}: got {t:g} s, expected {want:g} s; "
                          f"{predict_hint(times, PREDICT_CASES)}")
    return f"alpha + nbytes / beta in {len(PREDICT_CASES)} cases"


def _number(got, case) -> float:
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise Mistake(f"with {case}: predict_transfer_time returned {got!r:.80}, expected the "
                      "time in seconds (a float)"
                      f"{': return it (a print returns None)' if got is None else ''}")
    return float(got)
