"""What exercise 08's feedback says about a loss scale schedule that parted from torch's
(given the step where the learner's (scale, tracker) first differs from
``torch.amp.GradScaler``'s, and the state both held before it: the same, since the runs were
equal until then, name the rule that was broken), and the known mistakes of a skipped step,
declared as the factor the update is off by."""

from __future__ import annotations

import math

from ...engine.compare import Tolerance
from ...engine.diagnose import diagnose
from .ranks import initial_shard, scaled_grad, true_grad

FLOAT32 = Tolerance(1e-6, 0.0, dtype=None)  # float32 parameters, judged in float32


def _n(x: float) -> str:
    return f"{x:g}"


def schedule_mistake(k: int, before: tuple[float, int], found_inf: bool, got, want,
                     factors: tuple[float, float, int], reset_on_growth: bool) -> str:
    """One sentence (or two) for step ``k``: ``before`` is (scale, tracker) going in,
    ``got``/``want`` what the learner's and torch's update made of it; ``factors`` is
    (growth_factor, backoff_factor, growth_interval); ``reset_on_growth`` says whether the
    learner's run already reset its tracker after a growth."""
    (s0, t0), (s, t), (ws, wt) = before, got, want
    growth, backoff, interval = factors
    head = (f"at step {k} (found_inf={found_inf}, going in with scale={_n(s0)}, tracker={t0}) "
            f"your update returned (scale={_n(s)}, tracker={t}), torch's GradScaler "
            f"(scale={_n(ws)}, tracker={wt})")
    if found_inf:
        return f"{head}: {_overflow_hint(s0, t0, s, t, factors, reset_on_growth)}"
    return f"{head}: {_clean_hint(s0, t0, s, t, ws, factors)}"


def _overflow_hint(s0, t0, s, t, factors, reset_on_growth) -> str:
    growth, backoff, interval = factors
    if s != s0 * backoff:
        if s == s0:
            return ("did not back off at an overflow: when found_inf is True the scale is "
                    f"multiplied by backoff_factor ({_n(backoff)}), so that the next step's "
                    "gradients fit")
        if s == s0 * growth and t == 0 and t0 + 1 == interval:
            return (f"grew at an overflowing step (the tracker was at {t0}, one short of "
                    f"growth_interval={interval}, and you counted this step): check "
                    "found_inf first (an overflow backs off and resets the tracker), and "
                    "count and grow only on a clean step")
        if s == s0 / backoff:
            return (f"divided by backoff_factor={_n(backoff)} at an overflow, which grows "
                    "the scale: multiply by it (scale * backoff_factor), so that the next "
                    "step's gradients fit")
        if s == s0 * 0.5 and backoff != 0.5:
            return (f"backed off by 0.5, not by backoff_factor={_n(backoff)}: use the "
                    "argument, not torch's default")
        return (f"at an overflow the scale becomes scale * backoff_factor = "
                f"{_n(s0 * backoff)}")
    also = (" You reset the tracker on growth but not on backoff: both start the count "
            "again" if reset_on_growth else "")
    if t == t0:
        kept = "kept the count of clean steps"
    elif t == t0 + 1:
        kept = "counted the overflowing step as a clean one"
    else:
        kept = f"returned {t}"
    return (f"an overflow resets the tracker to 0 (the count of clean steps in a row starts "
            f"again), you {kept}.{also}")


def _clean_hint(s0, t0, s, t, ws, factors) -> str:
    growth, backoff, interval = factors
    clean = t0 + 1  # clean steps in a row, this one included
    if clean == interval and not math.isfinite(s0 * growth):
        if not math.isfinite(s):
            return (f"grew to {_n(s)}: scale * growth_factor ({_n(s0)} * {_n(growth)}) is not "
                    "finite, and torch then keeps the scale (an inf scale makes every "
                    "gradient inf and every step skip): grow only if math.isfinite(grown)")
        if s == ws and t != 0:
            return (f"kept the scale where scale * growth_factor is not finite, right, but "
                    f"returned tracker={t}: the count reached growth_interval={interval}, so "
                    "the tracker starts again at 0 even though the scale could not grow")
    if s == s0 * growth and ws == s0:
        return (f"grew after {clean} clean steps (growth_interval={interval}): the tracker "
                "must reach growth_interval: add this step to it first, then grow when it "
                "equals growth_interval")
    if ws == s0 * growth and s == s0:
        return (f"did not grow after {clean} clean steps in a row (growth_interval="
                f"{interval}): count this step first (tracker + 1), and grow when the count "
                "reaches growth_interval")
    if ws == s0 * growth and s == s0 * 2 and growth != 2:
        return (f"grew by 2, not by growth_factor={_n(growth)}: use the argument, not "
                "torch's default")
    if ws == s0 * growth and s == ws:
        return (f"grew at the right step, but the tracker must start again at 0 after a "
                f"growth (you returned {t}), or the next growth comes at the wrong time")
    if s == s0 * backoff:
        return "backed off at a clean step: only found_inf=True backs off"
    if s != ws:
        return f"the scale changed from {_n(s0)} to {_n(s)} where torch's became {_n(ws)}"
    return (f"a clean step adds one to the tracker (expected {t0 + 1}), unless that makes "
            "it reach growth_interval (then the scale grows and the tracker is 0)")


# -- a step's parameters -----------------------------------------------------------------------
def value_hint(got, want, k: int, r: int, plan: dict, master: bool) -> str:
    """Which known mistake, replayed from the oracle's state before step ``k`` (the runs
    were equal until then), gives the learner's parameters."""
    before = want[k - 1] if k else None
    p0 = before["params"][r] if before else initial_shard(r)
    buf = before["bufs"][r] if before else None
    scale = before["scale"] if before else plan["init_scale"]
    g, mine = true_grad(k, r, master), got[r][k]["param"]
    grown = want[k]["scale"] / scale
    known = [  # (the factor the mistake multiplies the gradient by, hint)
        (scale, f"the update is {scale:g} (the scale) times too large: the gradients still "
                "hold loss * scale: divide them by the scale before optimizer.step()"),
        (1 / scale, "the update is the scale times too small: the gradients were divided by "
                    "the scale twice")]
    if grown != 1:
        known.append((1 / grown, "the gradients were divided by the scale after update_scale "
                                 "changed it: unscale with the scale they were made with, "
                                 "then update it"))
    if master:
        g16 = scaled_grad(k, r, scale, {}, True)
        known.append(((g16 / scale).float() / g, "the gradients were unscaled in float16, "
                      "where values of ~2^-20 fall below float16's normal range and lose "
                      "their low bits: convert them to float32 first, then divide by the "
                      "scale (master.grad = model.grad.float() / scale)"))

    def replay(c):
        step = c * g if buf is None else plan["momentum"] * buf + c * g
        return p0 - plan["lr"] * step

    hint = diagnose(known, mine, replay, tol=FLOAT32)
    if hint:
        return hint
    if master:
        return ("unscale the float16 gradients into the float32 masters' .grad, step the "
                "optimizer (it holds the masters), then copy the masters into the model")
    return "unscale the gradients (divide by the current scale), then optimizer.step()"
