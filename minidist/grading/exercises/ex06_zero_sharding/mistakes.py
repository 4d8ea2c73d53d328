"""Exercise 06's known mistakes: shard boundaries that ignore the padding, pieces of unequal
size handed to the collectives, and a step or a gradient shard that is exactly what a known
mistake gives (declared as the reference's variant: gradients summed, each shard stepped
with its owner's gradient, the sum for the average, one backward pass instead of two)."""

from __future__ import annotations

from ...engine.compare import Tolerance
from ...engine.diagnose import diagnose
from .ranks import padding_text, shard_numel

TOLERANCE = Tolerance(1e-10, 1e-12)  # float64: the ranks sum the gradients in another order
STEP_MISTAKES = [  # (the gradient the reference steps with instead of the average, which is)
    ("sum", "gradients summed over the ranks, not averaged: divide the sum by world_size "
            "(op=\"avg\")"),
    ("own", "each shard stepped with its owner's own gradient: average the gradients over "
            "all ranks first (md.reduce_scatter with op=\"avg\")"),
]
BUCKET_MISTAKES = [  # (the reference's keywords, what its gradient shard then holds)
    ({"scale": 1}, "the sum over the ranks, not the average: divide by world_size"),
    ({"passes": 1}, "the last backward pass's gradient only: add into grad_shard, the "
                    "passes accumulate"),
]


def bounds_hint(got, n, p, r) -> str:
    s = shard_numel(n, p)
    lengths = [b - a for a, b in got]
    if any(k != s for k in lengths) and got[-1][1] == n and got[0][0] == 0:
        return (f"the shard boundaries ignore padding: {padding_text(n, p)}. Your shards hold "
                f"{lengths} elements; reduce_scatter and all_gather move equal pieces, so pad "
                f"the vector with zeros to p * ceil(n / p) = {s * p} elements and cut that")
    if any(k != s for k in lengths):
        return (f"every shard has ceil(numel / world_size) = {s} elements, yours have "
                f"{lengths}: {padding_text(n, p)}")
    return f"rank r's shard is [r * {s}, (r + 1) * {s}) of the padded vector"


def unequal_hint(text: str, p: int, cases, labels) -> str:
    """A hint when the ranks all-gathered (or reduce-scattered) pieces of unequal sizes."""
    case = next((c for c, label in zip(cases, labels) if f"with {label}:" in text), None)
    if case is None or "CollectiveMismatchError" not in text or "shard boundaries" in text:
        return ""
    return (f"\nThe ranks' pieces differ in size: {padding_text(case[0], p)}. Pad the vector "
            "with zeros to a multiple of world_size, so that every shard (and every piece "
            "the collectives move) has the same length")


def step_mistake(params, step: int, p: int, replay) -> str | None:
    """Which known mistake's parameters after ``step`` are ``params``; ``replay(grads)`` is
    the reference's trajectory with that gradient."""
    return diagnose(STEP_MISTAKES, params,
                    lambda grads: replay(grads)[step] if p > 1 else None, tol=TOLERANCE)


def bucket_mistake(shard, p: int, replay) -> str | None:
    """Which known mistake's gradient shard ``shard`` is; ``replay(**keywords)`` is the
    reference's shard with those keywords."""
    twice = ({"scale": p * p}, "the average divided by world_size once more: md.reduce "
                               "with op=\"avg\" already divides by world_size, so add the "
                               "reduced piece as it is")
    return diagnose([*BUCKET_MISTAKES, twice], shard,
                    lambda keywords: replay(**keywords) if p > 1 else None, tol=TOLERANCE)


def step_calls_hint(got: list[tuple[str, int]]) -> str:
    """Why a stage-1 step's collectives are not one reduce-scatter and one all-gather."""
    names = [c for c, _ in got]
    if "all_reduce" in names:
        return ("An all-reduce and a slice gives the same numbers, but it moves twice the "
                "bytes of a reduce-scatter and leaves every rank the whole averaged gradient, "
                "which stage 1 never needs")
    if names.count("all_gather") > 1 or "broadcast" in names:
        return "One all-gather of the updated shards already gives every rank every value"
    if len(got) == 2 and names == ["reduce_scatter", "all_gather"]:
        return ("The sizes are off: pad the gradient to world_size * shard before the "
                "reduce-scatter, and gather only this rank's shard")
    return "Average with the reduce-scatter first, then gather the updated shards"
