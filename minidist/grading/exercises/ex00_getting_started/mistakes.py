"""Exercise 00's known mistakes, as rows for ``engine.diagnose``: what the alpha-beta fit
and the transfer-time prediction give when a term is missing, a unit is off or two values
are swapped, and the hint for each."""

from __future__ import annotations

import math

from ...engine.diagnose import diagnose


def _near_pair(got: tuple[float, float], want: tuple) -> bool:
    """Each of (alpha, beta) the mistake fixes (not None) is within 0.1% of it."""
    return all(w is None or (w != 0 and abs(g - w) <= 1e-3 * abs(w)) for g, w in zip(got, want))


FIT_MISTAKES = [  # ((alpha, beta) as the mistake gives them from the true pair; None: any)
    (lambda alpha, beta: (beta, alpha), "alpha and beta are swapped"),
    (lambda alpha, beta: (None, 1 / beta),
     "beta is the bandwidth (bytes per second), the inverse of the fitted slope"),
    (lambda alpha, beta: (None, beta / 1e9), "keep SI units: seconds and bytes per second"),
    (lambda alpha, beta: (alpha * 1e6, None), "keep SI units: seconds and bytes per second"),
]


def fit_hint(a, b, alpha, beta) -> str:
    return diagnose(FIT_MISTAKES, (a, b), lambda mistake: mistake(alpha, beta),
                    same=_near_pair) or \
        "fit t = alpha + n / beta by least squares: np.linalg.lstsq on the columns [1, n]"


PREDICT_MISTAKES = [  # (the time the mistake predicts for (nbytes, alpha, beta), hint)
    (lambda n, a, b: n / b,
     "the latency alpha is missing: every message pays it, however small"),
    (lambda n, a, b: a,
     "the transfer term nbytes / beta is missing (nbytes // beta is floor division: it "
     "rounds the seconds down to a whole number, here 0; use /)"),
    (lambda n, a, b: a * 1e-6 + n / b,
     "alpha is already in seconds: do not scale it"),
    (lambda n, a, b: a + n / (b * 1e9),
     "beta is already in bytes per second, not GB/s: divide nbytes by beta itself"),
    (lambda n, a, b: a + n * b,
     "beta is a bandwidth in bytes per second: the size divided by it is seconds"),
    (lambda n, a, b: a + 8 * n / b, "nbytes and beta are both in bytes: no factor 8"),
    (lambda n, a, b: 2 * (a + n / b),
     "that is a round trip: one message, one way, takes alpha + n / beta"),
    (lambda n, a, b: (a + n / b) * 1e6, "return seconds, not micro- or milliseconds"),
    (lambda n, a, b: (a + n / b) * 1e3, "return seconds, not micro- or milliseconds"),
]


def predict_hint(times, cases) -> str:
    """The hint of the known mistake that gives every one of ``times`` on ``cases`` (all
    cases at once: in one case alone two mistakes can give the same time)."""
    return diagnose(PREDICT_MISTAKES, times,
                    lambda mistake: [mistake(n, a, b) for n, a, b in cases],
                    same=lambda got, want: all(math.isclose(g, w, rel_tol=1e-6)
                                               for g, w in zip(got, want))) or \
        "a message of n bytes takes alpha + n / beta seconds in the alpha-beta model"


def timing_hint(ratio: float, iters: int) -> str:
    """What a ping-pong's reported time is, from its ratio to the link's added latency."""
    if 1.7 <= ratio <= 2.6:
        return "that is the round trip: one-way time is half of it"
    if 0.8 * iters <= ratio <= 1.3 * iters:
        return f"that is the time of all {iters} round trips, halved: divide by iters too"
    if 1.7 * iters <= ratio <= 2.6 * iters:
        return f"that is the total of all {iters} round trips: divide by 2 * iters"
    if ratio < 0.85:
        return "too short: time the whole loop, from before the first send to after the last recv"
    return "expected about the added latency: mean round-trip time / 2"
