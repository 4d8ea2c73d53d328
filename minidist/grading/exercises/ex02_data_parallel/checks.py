"""Exercise 02's tests: the learner's shards against torch's ``DistributedSampler``, the
buckets against ``md.DistributedDataParallel``'s own rule; then the stages of the mechanism:
a hook per parameter that all-reduces (``register_allreduce_hooks``), buckets reduced in
order as soon as they are ready (``register_bucket_hooks``), and the same buckets reduced on
a thread while backward goes on (``register_overlapped_hooks``, the stretch part).

The stages' reference is one process: after every backward, each rank's gradients must be
those of the whole batch. The all-reduces are judged too: every call of ``md.all_reduce``
(under any name: ``sandbox.observe``) is recorded with its size, its thread and how many
gradients backward had produced when it started (``ranks.Recorder``), so a version that
waits for the end of backward, reduces in another order or blocks backward is named as
such. The machinery being built (minidist's DDP, naive wrapper, bucket scheduler,
communication thread, ``all_reduce_coalesced``; torch's DDP) is out of reach
(``sandbox.DATA_PARALLEL``).
"""

from __future__ import annotations

import torch
from torch import nn

from ....parallel.data.buckets import assign_buckets
from ...engine.compare import close
from ...engine.feedback import Mistake
from .mistakes import bucket_hint, buckets_of, early_hint, grad_hint, order_hint, shard_hint, short
from .ranks import BATCH, NAMES, STEPS, batch, stage_case, stage_model, torch_sampler

SHARD_CASES = [(10, 3, False, 0, 0), (12, 4, False, 0, 0), (10, 3, True, 0, 0),
               (10, 3, True, 0, 1), (17, 4, True, 42, 5), (2, 4, True, 7, 0),
               (1, 1, True, 0, 0), (100, 8, True, 3, 2), (2, 5, True, 1, 0),
               (3, 8, False, 0, 0)]
BUCKET_CASES = [  # (parameter sizes in bytes, cap in bytes); unequal sizes first: they tell
    # the order the sizes were read in from the order the indices were numbered in
    ([400, 4_000_000, 40, 40, 40_000], 50_000), ([4000] * 10, 10_000),
    ([100, 200, 300], 10**9), ([], 1000), ([4096, 4096, 4096, 4096], 8192),
    ([1000, 1, 1, 1, 50_000, 1, 1], 1000),
]


def check_shard_indices(learner) -> str:
    calls, labels = [], []
    for n, p, shuffle, seed, epoch in SHARD_CASES:
        case = f"n={n}, world_size={p}, shuffle={shuffle}, seed={seed}, epoch={epoch}"
        calls += [(n, r, p, shuffle, seed, epoch) for r in range(p)]
        labels += [case] * p
    results = iter(learner.call_each("shard_indices", calls, labels))
    for n, p, shuffle, seed, epoch in SHARD_CASES:
        case = f"n={n}, world_size={p}, shuffle={shuffle}, seed={seed}, epoch={epoch}"
        got = [_as_list(next(results), r, case) for r in range(p)]
        want = [list(torch_sampler(n, r, p, shuffle, seed, epoch)) for r in range(p)]
        for r in range(p):
            if got[r] != want[r]:
                raise Mistake(f"with {case}: rank {r} got {short(got[r])}, expected "
                              f"{short(want[r])} (torch's DistributedSampler); "
                              f"{shard_hint(got, want, n, p, (shuffle, seed, epoch))}")
    return f"the same shards as torch's DistributedSampler in {len(SHARD_CASES)} cases"


def _as_list(result, rank, case) -> list[int]:
    """The indices as a list of ints: from a list, a tuple or a tensor (the same answer)."""
    if isinstance(result, torch.Tensor):
        result = result.flatten().tolist()
    if isinstance(result, (list, tuple)) and all(
            isinstance(i, int) or isinstance(i, float) and i.is_integer() for i in result):
        return [int(i) for i in result]
    raise Mistake(f"with {case}: rank {rank}: shard_indices returned {result!r:.80}, "
                  "expected a list of ints")


def check_assign_buckets(learner) -> str:
    labels = [f"parameter sizes {sizes} bytes and cap {cap} bytes" for sizes, cap in BUCKET_CASES]
    results = learner.call_each("assign_buckets", [(list(s), c) for s, c in BUCKET_CASES],
                                labels)
    for (sizes, cap), case, got in zip(BUCKET_CASES, labels, results):
        want = assign_buckets([torch.empty(s, dtype=torch.uint8) for s in sizes], cap)
        if buckets_of(got) != want:
            raise Mistake(f"with {case}: got {got!r:.200}, expected {want}; "
                          f"{bucket_hint(got, want, sizes, cap)}")
    return f"the buckets of md.DistributedDataParallel in {len(BUCKET_CASES)} cases"


# -- the stages: hooks, buckets, overlap ---------------------------------------------------------
WORLD_SIZES = (2, 3)
REVERSE, FORWARD, ONE = [[7, 6], [5, 4, 3], [2, 1, 0]], [[0, 1, 2], [3, 4], [5, 6, 7]], \
    [[7, 6, 5, 4, 3, 2, 1, 0]]
CASES = {  # stage: [(buckets, slow)]; slow: a layer whose backward waits for the first bucket
    "hooks": [(None, False)],
    "buckets": [(REVERSE, False), (FORWARD, False), (ONE, False)],
    "overlap": [(REVERSE, True), (FORWARD, False)],
}


def _full_grads(frozen: bool, step: int, lo: int = 0, hi: int = BATCH) -> dict:
    """The oracle: one process's gradients on samples [lo, hi) of step ``step``'s batch."""
    model, (x, y) = stage_model(frozen), batch(step)
    nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _label(p: int, stage: str, buckets, slow: bool) -> str:
    return f"world_size={p}" + ("" if buckets is None else f", buckets={buckets}")


def _run_stage(learner, stage: str) -> None:
    frozen = stage == "hooks"
    numels = [p.numel() for p in stage_model(frozen).parameters()]
    trainable = [i for i, p in enumerate(stage_model(frozen).parameters()) if p.requires_grad]
    full = [_full_grads(frozen, s) for s in range(STEPS)]
    worlds = {p: [(stage, b, slow) for b, slow in CASES[stage]] for p in WORLD_SIZES}
    for p, (_, buckets, slow), label, results in learner.each_world(
            stage_case, NAMES[stage], worlds, _label):
        for rank, result in enumerate(results):
            shard = (rank * BATCH // p, (rank + 1) * BATCH // p)
            for step, got in enumerate(_steps(result["value"], full[0])):
                where = f"with {label}: rank {rank}, backward pass {step + 1}"
                local = _full_grads(frozen, step, *shard)
                late = got.get("finished", 0) < len(got["calls"])
                if stage == "overlap":  # first: threads racing also leave wrong gradients
                    _one_thread(got["calls"], where)
                _check_grads(got["grads"], full[step], local, where, p, (stage, step, late))
                _check_calls(got["calls"], stage, buckets, slow, numels, trainable, where)


def _steps(value, full) -> list[dict]:
    """The ranks' record of each backward pass, checked to be what the test code sends."""
    if not (isinstance(value, list) and len(value) == STEPS and
            all(isinstance(s, dict) and set(s.get("grads", {})) == set(full) for s in value)):
        raise Mistake("the rank's gradients did not come back (did your function replace the "
                      "model's parameters?)")
    return value


def _check_grads(got: dict, full: dict, local: dict, where: str, p: int, when) -> None:
    """``when``: (stage, backward pass, whether an all-reduce was still running when
    backward returned)."""
    for name, want in full.items():
        g, at = got[name], f"{where}: parameter {name}"
        if want is None:
            if g is not None:
                raise Mistake(f"{at} is frozen (requires_grad=False) and had no gradient, but "
                              "now has one: register hooks only on parameters that require "
                              "a gradient")
            continue
        if not isinstance(g, torch.Tensor) or g.shape != want.shape:
            raise Mistake(f"{at}: .grad is {g!r:.80} after backward, expected a tensor of "
                          f"shape {tuple(want.shape)}")
        if not close(g, want):
            raise Mistake(f"{at}: {grad_hint(g, want, local[name], p, *when)}")


def _check_calls(calls, stage, buckets, slow, numels, trainable, where) -> None:
    sizes = [c["numel"] for c in calls]
    if stage == "hooks":
        if sorted(sizes) != sorted(numels[i] for i in trainable):
            raise Mistake(f"{where}: md.all_reduce ran {len(sizes)} time(s), on tensors of "
                          f"{sizes} elements; expected one all-reduce per parameter that has "
                          f"a gradient ({len(trainable)}), each of its gradient, in its own "
                          "hook")
    else:
        want = [sum(numels[i] for i in b) for b in buckets]
        if sizes != want:
            raise Mistake(f"{where}: {order_hint(sizes, want, numels)}")
    if calls and calls[0]["ready"] >= len(trainable) and (stage == "hooks" or buckets == REVERSE):
        raise Mistake(f"{where}: the first all-reduce started only once backward had computed "
                      "every gradient; " + early_hint(stage))
    if stage == "overlap":
        _check_thread(calls, slow, where)


def _one_thread(calls, where) -> None:
    threads = len({c["thread"] for c in calls if not c["main"]})
    if threads > 1:
        raise Mistake(f"{where}: the all-reduces of one backward pass ran on {threads} "
                      "threads; use one worker thread, so that the buckets are reduced in "
                      "order (threads of their own start their all-reduces in any order, and "
                      "the ranks' collectives then pair up different buckets)")


def _check_thread(calls, slow, where) -> None:
    if any(c["main"] for c in calls):
        raise Mistake(f"{where}: the all-reduces ran on the thread that runs backward; hand "
                      "each ready bucket to one worker thread, which reduces the buckets in "
                      "order while backward goes on")
    if slow and calls and calls[0]["progressed"] is False:
        raise Mistake(f"{where}: backward stopped while the thread reduced the first bucket "
                      "(the hook waited for it): a hook must hand the bucket over and return "
                      "at once; wait for the thread only at the end of backward")


def check_allreduce_hooks(learner) -> str:
    _run_stage(learner, "hooks")
    return ("the full-batch gradient on every rank, one all-reduce per parameter during "
            "backward, frozen parameters left alone, world sizes 2 and 3")


def check_bucket_hooks(learner) -> str:
    _run_stage(learner, "buckets")
    return ("the full-batch gradient on every rank, one all-reduce per bucket, in bucket "
            "order, each started as soon as it could be, world sizes 2 and 3")


def check_overlapped_hooks(learner) -> str:
    _run_stage(learner, "overlap")
    return ("the full-batch gradient when backward returns, the buckets reduced in order on "
            "one worker thread while backward went on, world sizes 2 and 3")
