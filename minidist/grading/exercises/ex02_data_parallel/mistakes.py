"""Exercise 02's hints: what a wrong shard, a wrong bucket list, a wrong gradient or a wrong
sequence of all-reduces is, in terms of the mistake that produces it."""

from __future__ import annotations

import torch

from ...engine.diagnose import diagnose
from .ranks import torch_sampler


def short(xs, limit=10) -> str:
    return str(xs) if len(xs) <= limit else str(xs[:limit])[:-1] + f", ... ({len(xs)} items)]"


# -- the sampler's shards ---------------------------------------------------------------------
def shard_hint(got, want, n, p, order) -> str:
    shuffle, seed, epoch = order
    if n % p and all(len(g) == n // p for g in got):
        return (f"every rank got n // world_size = {n // p} indices: that drops the last "
                f"{n % p}, as drop_last=True does; DistributedSampler's default pads instead: "
                f"every rank gets ceil(n / world_size) = {len(want[0])} indices, the list "
                "repeated from its start until its length divides by world_size")
    if any(len(g) != len(want[0]) for g in got):
        short_list = " (when more padding is needed than n, repeat the list more than once)" \
            if p * len(want[0]) - n > n else ""
        return (f"every rank gets ceil(n / world_size) = {len(want[0])} indices: pad the list "
                f"by repeating it from the start until its length divides by world_size"
                f"{short_list}")
    if shuffle and epoch and got == [list(torch_sampler(n, r, p, True, seed, 0))
                                     for r in range(p)]:
        return ("these are the shards of epoch 0: the order must change every epoch, the "
                "same on every rank: seed the generator with seed + epoch")
    if sorted(sum(got, [])) == sorted(sum(want, [])):
        return ("the right indices, split the wrong way: rank r takes every world_size-th "
                "index starting at r (indices[rank::world_size])")
    mine, theirs = _interleaved(got), _interleaved(want)
    if mine[:n] == theirs[:n]:
        return (f"the first n = {n} indices are right, the padding is not: pad with the "
                "list's own first indices (indices += indices[:total - n], repeated while "
                "still short), as DistributedSampler does")
    missing = sorted(set(range(n)) - set(mine))
    if shuffle and missing:
        return (f"index {missing[0]} is on no rank, while others are on several: the ranks "
                "shuffled differently. Every rank must draw the same permutation: seed the "
                "generator with seed + epoch only, never with the rank")
    if shuffle:
        return ("the order differs: permute with torch.randperm(n, generator=g) where "
                "g = torch.Generator(); g.manual_seed(seed + epoch), the same on every rank")
    return "without shuffling, the indices are 0, 1, ..., n-1 (padded), split by rank"


def _interleaved(shards: list[list[int]]) -> list[int]:
    """The list the shards were taken from, rank r holding positions r, r + p, ..."""
    return [s[k] for k in range(max(map(len, shards), default=0)) for s in shards
            if k < len(s)]


# -- bucket assignment -----------------------------------------------------------------------
def buckets_of(got) -> list[list[int]] | None:
    """A list of lists of ints from any sequences of sequences of integers (tuples,
    tensors): the same answer in another container."""
    try:
        if isinstance(got, torch.Tensor) or not isinstance(got, (list, tuple)):
            return None
        out = [b.tolist() if isinstance(b, torch.Tensor) else list(b) for b in got]
        return out if all(isinstance(i, int) for b in out for i in b) else None
    except TypeError:
        return None


def bucket_hint(got, want, sizes, cap) -> str:
    buckets = buckets_of(got)
    if buckets is None:
        return "return a list of buckets, each a list of parameter indices"
    flat, last_first = [i for b in buckets for i in b], list(range(len(sizes)))[::-1]
    if any(not b for b in buckets):
        return (f"bucket {[len(b) for b in buckets].index(0)} of {buckets} is empty: append "
                "the last bucket only if it holds a parameter")
    if sizes and flat == [sizes[i] for i in last_first] and flat != last_first:
        return ("the buckets hold the parameters' sizes; they hold the parameters' indices "
                "(i for sizes[i])")
    if sorted(flat) != list(range(len(sizes))):
        if flat and flat == last_first[:len(flat)]:
            return ("the last, partly full bucket is missing: after the loop, append the "
                    "bucket being filled if it holds a parameter")
        return "every parameter index must be in exactly one bucket"
    mirrored = [[len(sizes) - 1 - i for i in b] for b in want]
    if buckets == mirrored != _by_rule(sizes, cap, forward=True):  # else: forward order
        return ("the right buckets, numbered the wrong way: the sizes were taken last first "
                "but counted from 0; a bucket holds the parameters' own indices "
                f"(len(sizes) - 1 = {len(sizes) - 1} first)")
    if flat != last_first:
        return ("fill buckets in reverse order, starting from the last parameter: backward "
                "produces the gradients of the last layers first")
    known = [  # (a rule that gives these buckets, hint)
        (dict(strict=True), "a bucket closed only once it held more than cap bytes: close it "
                            "at cap bytes or more (>= cap, not > cap)"),
        (dict(carry=True), "a new bucket starts empty: the bytes of the parameter that "
                           "crossed the cap stay in the bucket it closed and do not count "
                           "toward the next"),
        (dict(scale=2 ** 20), "these are the buckets of a cap of cap MB: cap is in bytes "
                              "already (DDP's bucket_cap_mb is in megabytes, this cap is "
                              "not)"),
    ]
    for rule, hint in known:
        if buckets == _by_rule(sizes, cap, **rule) != want:
            return hint
    return ("close a bucket as soon as it holds cap bytes or more (the parameter that "
            "crosses the cap stays in it), then start a new one; a last, partly full "
            "bucket closes at the end")


def _by_rule(sizes, cap, strict=False, carry=False, scale=1, forward=False) -> list[list[int]]:
    """The buckets another rule gives (the right one with no arguments)."""
    out, current, filled, cap = [], [], 0, cap * scale
    for i in range(len(sizes)) if forward else reversed(range(len(sizes))):
        current.append(i)
        filled += sizes[i]
        if filled > cap if strict else filled >= cap:
            out.append(current)
            current, filled = [], filled - cap if carry else 0
    return out + ([current] if current else [])


# -- the stages ---------------------------------------------------------------------------------
def grad_hint(g, want, local, p, stage, step, late) -> str:
    """``g``: a rank's gradient after backward; ``want``: the full batch's; ``local``: the
    rank's own shard's; ``late``: an all-reduce was still running when backward returned."""
    known = [  # (what the mistake leaves in .grad, hint)
        (lambda: want * p,
         f"it is {p} times too large: you summed the gradients; divide by world_size"),
        (lambda: local if late else None,
         "when backward() returned, it was still this rank's own gradient: the thread had not "
         "reduced its bucket yet. Wait for the thread at the end of backward (a callback "
         "queued on the autograd engine), so that backward() returns only once every bucket "
         "is done"),
        (lambda: local if step > 0 else None,
         "it is still this rank's own gradient: the first backward pass was averaged, this "
         "one was not. Whatever the hooks remember during a pass (which gradients are ready, "
         "which bucket is next) must start afresh for the next"),
        (lambda: local,
         "it is still this rank's own gradient: it was never all-reduced, or the all-reduced "
         "values were not copied back into .grad"),
    ]
    hint = diagnose(known, g)
    if hint:
        return hint
    err = (g - want).abs().max().item()
    return (f"it differs from the full-batch gradient by up to {err:.3g} (was it copied back "
            "from the wrong part of the bucket, or reduced twice?)")


def order_hint(sizes, want, numels) -> str:
    head = (f"md.all_reduce ran on tensors of {sizes} elements, expected one per bucket, of "
            f"{want} elements, in bucket order")
    if sorted(sizes) == sorted(want):
        return (head + ": the right buckets in the wrong order. Reduce bucket 0 first, then 1, "
                "...: a bucket that is ready before the one ahead of it waits, so that every "
                "rank issues the same all-reduces in the same order whatever order its "
                "gradients arrive in")
    if len(sizes) == 1 < len(want) and sizes[0] == sum(want):
        return (head + ": one all-reduce of every gradient at once, once all were ready. "
                "Reduce each bucket on its own, as soon as it (and every bucket before it) is "
                "ready, so that its communication overlaps the rest of backward")
    if sorted(sizes) == sorted(numels):
        return (head + ": one all-reduce per parameter. Flatten a bucket's gradients into one "
                "tensor, all-reduce it once, and copy the parts back into each .grad")
    return head


def early_hint(stage: str) -> str:
    if stage == "hooks":
        return ("all-reduce each gradient in its own hook, as soon as it has been accumulated, "
                "while backward goes on to the earlier layers")
    return ("start each bucket's all-reduce as soon as its last gradient is ready, while "
            "backward still computes the earlier layers")
