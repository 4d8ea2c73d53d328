"""Exercise 06's tests: the shard boundaries against ``md.ZeRO``'s layout, stage 1's step
against one process stepping the whole vector with the averaged gradient, and (stretch) the
gradient shards stage 2's bucket reduction leaves on each rank, and the reduces that left them
(one per owner the bucket overlaps, of the overlap's size, in owner order)."""

from __future__ import annotations

import torch

from ...engine.compare import close, compare
from ...engine.feedback import Mistake
from .mistakes import (
    TOLERANCE,
    bounds_hint,
    bucket_mistake,
    step_calls_hint,
    step_mistake,
    unequal_hint,
)
from .ranks import (
    BUCKET_PASSES,
    OPTIMIZERS,
    STEPS,
    bucket_case,
    initial_params,
    optimizer_problem,
    rank_grad,
    shard_numel,
    step_case,
)

BOUNDS_CASES = [(10, 4), (13, 4), (12, 4), (3, 4), (7, 3), (5, 2), (1, 1), (100, 8), (9, 8)]
STEP_CASES = {4: [(10, "sgd"), (13, "adamw"), (3, "sgd")], 3: [(10, "adamw"), (7, "sgd")],
              2: [(7, "sgd")], 1: [(5, "adamw")]}  # world size -> (numel, optimizer)
BUCKET_CASES = {4: [(10, [(7, 10), (2, 7), (0, 2)]), (13, [(4, 13), (0, 4)]),
                    (3, [(1, 3), (0, 1)])],
                3: [(10, [(5, 10), (4, 5), (0, 4)])], 2: [(7, [(0, 7)])],
                1: [(5, [(2, 5), (0, 2)])]}  # world size -> (numel, buckets in their order)


# -- part 1: the shard boundaries ---------------------------------------------------------------
def check_shard_bounds(learner) -> str:
    calls = [(n, r, p) for n, p in BOUNDS_CASES for r in range(p)]
    labels = [f"numel={n}, rank={r}, world_size={p}" for n, r, p in calls]
    results = iter(learner.call_each("shard_bounds", calls, labels))
    for n, p in BOUNDS_CASES:
        got = [_pair(next(results), n, r, p) for r in range(p)]
        s = shard_numel(n, p)
        for r in range(p):
            if got[r] != (r * s, (r + 1) * s):
                raise Mistake(f"shard_bounds({n}, {r}, {p}) returned {got[r]}, expected "
                              f"{(r * s, (r + 1) * s)}: {bounds_hint(got, n, p, r)}")
    return (f"the shards of md.ZeRO's padded flat layout in {len(BOUNDS_CASES)} cases, "
            "1 to 8 ranks")


def _pair(value, n, r, p) -> tuple[int, int]:
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) or isinstance(v, float) and v.is_integer() for v in value)
    if not ok:
        raise Mistake(f"shard_bounds({n}, {r}, {p}) returned {value!r:.60}, expected a pair "
                      "(start, end) of ints")
    return int(value[0]), int(value[1])


# -- part 2: stage 1's step ---------------------------------------------------------------------
def reference(numel: int, p: int, optimizer: str, grads: str = "avg") -> list[torch.Tensor]:
    """One process: the whole vector stepped ``STEPS`` times with the gradient ``grads``:
    "avg" (the right one), "sum", or "own" (element i with its owner rank's own gradient)."""
    params = torch.nn.Parameter(initial_params(numel))
    opt, out, s = OPTIMIZERS[optimizer][1]([params]), [], shard_numel(numel, p)
    for step in range(STEPS):
        every = torch.stack([rank_grad(r, numel, step) for r in range(p)])
        if grads == "own":
            params.grad = every[torch.arange(numel) // s, torch.arange(numel)]
        else:
            params.grad = every.sum(0) / (p if grads == "avg" else 1)
        opt.step()
        out.append(params.detach().clone())
    return out


def _step_label(p: int, n: int, opt: str) -> str:
    return f"world_size={p}, {n} parameters, {OPTIMIZERS[opt][0]}"


def _unequal(text: str, p: int, cases, labels) -> str:
    return f"{text}{unequal_hint(text, p, cases, labels)}"


def check_zero1_step(learner) -> str:
    for p, (n, opt), label, results in learner.each_world(step_case, "zero1_step", STEP_CASES,
                                                          _step_label, _unequal):
        got = [r["value"] for r in results]
        _check_optimizers(got, n, p, label)
        _check_same_everywhere(got, n, p, opt, label)
        _check_values(got[0]["history"], n, p, opt, label)
        if p > 1:
            for r, v in enumerate(got):
                _check_step_calls(v["calls"], n, p, r, label)
    return ("one process's parameters after 3 steps of SGD with momentum and of AdamW on 1 to "
            "4 ranks, sizes that do not divide by the world size; each rank's optimizer over "
            "its shard only; per step exactly one reduce-scatter of the padded gradient and "
            "one all-gather of the shard")


def _check_step_calls(steps: list, n, p, r, label) -> None:
    """Stage 1's communication, exactly: one md.reduce_scatter of the padded gradient (s * p
    elements), then one md.all_gather of this rank's shard (s), and nothing else."""
    s = shard_numel(n, p)
    want = [("reduce_scatter", s * p), ("all_gather", s)]
    for step, calls in enumerate(steps):
        got = [(c["name"], c["numel"]) for c in calls]
        if got == want:
            continue
        said = ", ".join(f"md.{c} of {k}" for c, k in got) or "no collective"
        raise Mistake(f"with {label}: the parameters are right, but step {step + 1} on rank {r} "
                      f"called {said} (elements sent); stage 1 needs exactly md.reduce_scatter "
                      f"of the padded gradient ({s * p} elements: each rank receives only its "
                      f"shard of the average) and then md.all_gather of its shard ({s}). "
                      + step_calls_hint(got))


def _check_optimizers(got, n, p, label) -> None:
    for r, v in enumerate(got):
        problem = optimizer_problem(v["sizes"], v["step"], n, p, r)
        if problem:
            raise Mistake(f"with {label}: {problem}")


def _check_same_everywhere(got, n, p, opt, label) -> None:
    first = reference(n, p, opt)[0]
    s, start = shard_numel(n, p), initial_params(n)
    for r, v in enumerate(got):
        a, b = r * s, min((r + 1) * s, n)
        mine = torch.zeros(n, dtype=torch.bool)
        mine[a:b] = True
        h = v["history"][0]
        if p > 1 and torch.allclose(h[mine], first[mine]) and torch.equal(h[~mine], start[~mine]):
            raise Mistake(f"with {label}: after step 1, rank {r}'s parameters changed only "
                          f"inside its own shard [{a}, {b}): all-gather the updated shards, so "
                          "that every rank has every rank's new values")
    for step in range(len(got[0]["history"])):
        for r in range(1, p):
            diff = (got[r]["history"][step] != got[0]["history"][step]).nonzero().flatten()
            if len(diff):
                i = int(diff[0])
                raise Mistake(f"with {label}: after step {step + 1}, the gathered parameters "
                              f"differ across ranks at index {i}: rank 0 has "
                              f"{got[0]['history'][step][i]:.6g}, rank {r} has "
                              f"{got[r]['history'][step][i]:.6g}. After the all-gather every "
                              "rank must hold the same full vector")


def _check_values(history, n, p, opt, label) -> None:
    want, start = reference(n, p, opt), initial_params(n)
    for step, (h, w) in enumerate(zip(history, want)):
        if _close(h, w):
            continue
        at = f"with {label}: after step {step + 1}"
        if step == 0 and torch.equal(h, start):
            raise Mistake(f"{at} the parameters did not change: update params in place "
                          "(params.copy_(...)); the caller keeps that tensor")
        mistake = step_mistake(h, step, p, lambda grads: reference(n, p, opt, grads))
        if mistake:
            raise Mistake(f"{at} the parameters are those of {mistake}")
        raise Mistake(f"{at}: {compare(h, w, 'the parameters')} (one process stepping the "
                      "whole vector with the averaged gradient)")


def _close(got, want) -> bool:
    return close(got, want, TOLERANCE)


# -- stretch: stage 2's reduction of a bucket ----------------------------------------------------
def bucket_reference(numel, p, buckets, rank, passes=BUCKET_PASSES, scale=None) -> torch.Tensor:
    s = shard_numel(numel, p)
    out = torch.zeros(s * p, dtype=torch.float64)
    covered = torch.zeros(s * p, dtype=torch.bool)
    for lo, hi in buckets:
        covered[lo:hi] = True
    for step in range(BUCKET_PASSES - passes, BUCKET_PASSES):
        total = sum(rank_grad(r, numel, step) for r in range(p))
        out[:numel] += total / (p if scale is None else scale)
    out[~covered] = 0
    return out[rank * s:(rank + 1) * s]


def _bucket_label(p: int, n: int, buckets) -> str:
    return (f"world_size={p}, {n} parameters (shards of {shard_numel(n, p)}), buckets "
            f"{buckets} in that order, {BUCKET_PASSES} backward passes")


def check_reduce_bucket(learner) -> str:
    for p, (n, buckets), label, results in learner.each_world(
            bucket_case, "reduce_bucket", BUCKET_CASES, _bucket_label):
        for r in range(p):
            _check_shard(results[r]["value"], n, p, buckets, r, label)
        calls = results[0]["value"]["all_reduces"]
        if calls and p > 1:
            raise Mistake(f"with {label}: reduce_bucket called md.all_reduce ({calls} "
                          "time(s)): then every rank holds the averaged gradient of the "
                          "whole bucket, the memory stage 2 is there to save. Reduce each "
                          "rank's piece to that rank only (md.reduce with dst=owner)")
        if p > 1:
            for r in range(p):
                _check_bucket_calls(results[r]["value"]["calls"], n, p, buckets, r, label)
    return ("every rank's gradient shard the average over the ranks, accumulated over two "
            "backward passes of buckets that cross shard boundaries, 1 to 4 ranks, by exactly "
            "one md.reduce per owner of the bucket's overlap with its shard, in owner order")


def _owner_pieces(n: int, p: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(owner, start, end) of every shard the bucket [lo, hi) overlaps, in owner order."""
    s = shard_numel(n, p)
    pieces = [(q, max(lo, q * s), min(hi, (q + 1) * s)) for q in range(p)]
    return [(q, a, b) for q, a, b in pieces if a < b]


def _check_bucket_calls(made: list, n, p, buckets, r, label) -> None:
    """Exactly one md.reduce per owner the bucket overlaps, of the overlap's size, to that
    owner, in owner order (the same order on every rank), and no other collective."""
    for (lo, hi), calls in zip(buckets, made):
        want = [("reduce", b - a, q) for q, a, b in _owner_pieces(n, p, lo, hi)]
        got = [(c["name"], c["numel"], c["dst"]) for c in calls]
        if got == want:
            continue
        said = ", ".join(f"md.{c} of {k} element{'s' if k != 1 else ''}"
                         + (f" to rank {d}" if c == "reduce" else "")
                         for c, k, d in got) or "no collective"
        need = ", ".join(f"md.reduce of {k} to rank {d}" for _, k, d in want)
        raise Mistake(f"with {label}: the gradient shards are right, but on rank {r} "
                      f"reduce_bucket({lo}, {hi}) called {said}; the bucket [{lo}, {hi}) "
                      f"needs exactly {need}: one md.reduce per shard the bucket overlaps, of "
                      "the overlap only, to its owner, in owner order (each element crosses "
                      "the network once, to the one rank that keeps it)")


def _check_shard(value, n, p, buckets, r, label) -> None:
    got, want = value["grad_shard"], bucket_reference(n, p, buckets, r)
    s = shard_numel(n, p)
    if _close(got, want):
        return
    at = f"with {label}: rank {r}'s gradient shard (flat elements [{r * s}, {(r + 1) * s}))"
    mistake = bucket_mistake(got, p, lambda **kw: bucket_reference(n, p, buckets, r, **kw))
    if mistake:
        raise Mistake(f"{at} holds {mistake}")
    problem = compare(got, want, "grad_shard").split(": ", 1)[1]
    raise Mistake(f"{at}: {problem}. Element i of grad_shard is flat element {r * s} + i: the "
                  "piece of the bucket [lo, lo + len(bucket_grad)) that falls inside "
                  f"[{r * s}, {(r + 1) * s}) goes to rank {r}, into "
                  f"grad_shard[start - {r * s}:end - {r * s}]")

