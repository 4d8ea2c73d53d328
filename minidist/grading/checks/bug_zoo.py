"""Tests of exercise 10, the bug zoo: seven real distributed-training bugs, each fixed
function graded by an equivalence check on inputs that expose its bug (the core's five
here, the stretch's two in ``bug_zoo_stretch.py``).

Oracles (``bug_zoo_probe.py``): one process on every rank's samples (averaged gradients),
the exact sum over ranks and the ring's byte count 2(p-1)/p·n (Patarasuk and Yuan 2009),
one process holding every shard under one skip decision (found_inf), torch's
``DistributedSampler`` with ``set_epoch``, ZeRO's padded flat layout (Rajbhandari et al.
2020), the float32 gradient (Micikevicius et al. 2018, loss scaling), and the pipeline's
layers composed in one process (1F1B, Narayanan et al. 2019). The feedback names the symptom
as it shows in a run, then the cause. The library's version of each fix is out of reach
where calling it would skip the exercise: DDP (``DATA_PARALLEL``), the collectives
(``COLLECTIVES``, for the ring), the scalers (``AMP``), ``md.ZeRO`` (``ZERO``) and the
pipeline schedules (``PIPELINE``); ``md.all_reduce``, ``md.reduce_scatter``,
``md.all_gather`` and ``md.DistributedSampler`` stay: the fixed code is built on them.
"""

from __future__ import annotations

import torch

from ..engine.feedback import Mistake, values
from ..engine.sandbox import AMP, COLLECTIVES, DATA_PARALLEL, ZERO
from ..engine.spec import GradedTest
from . import bug_zoo_probe as probe
from .bug_zoo_stretch import TESTS as STRETCH
from .bug_zoo_stretch import close as _close
from .mixed_precision import ranks_text


# -- 1. gradients summed, not averaged ---------------------------------------------------------
def check_average_gradients(learner) -> str:
    for p in (2, 4):
        got = learner.run_ranks(probe.average_case, p, [(0,)], "average_gradients",
                                [f"world_size={p}"])
        want = probe.mean_grads(0, p)
        for r in range(p):
            grads = got[r][0]["value"]
            for name, g, w in zip(("weight", "bias"), grads, want):
                if _close(g, w):
                    continue
                raise Mistake(f"with world_size={p}: after average_gradients rank {r}'s "
                              f"{name} gradient is {values(g)}, one process on all {p} ranks' "
                              f"samples has {values(w)}: {_average_hint(g, w, p, r)}")
    return ("every rank's gradients equal one process's on all ranks' samples, on 2 and 4 "
            "ranks")


def _average_hint(g, w, p: int, r: int) -> str:
    if not isinstance(g, torch.Tensor) or g.shape != w.shape:
        return "keep each .grad a tensor of its parameter's shape"
    ratio = float((g * w).sum() / (w * w).sum())
    if _close(g, ratio * w, 1e-6):
        if abs(ratio - p) < 1e-6:
            return (f"they are {p}x the average (the sum over the ranks), so every SGD step "
                    f"is {p}x too large and the run trains as if lr were {p}x larger: divide "
                    "the summed gradients by comm.world_size")
        return (f"they are {ratio:.4g}x the average over the {p} ranks: divide the sum by "
                "comm.world_size, once")
    local = probe.local_grads(0, r)
    if any(_close(g, x) for x in local):
        return "they are this rank's own gradients: sum them over the ranks first"
    return "all-reduce each gradient with op=\"sum\" and divide by comm.world_size"


# -- 2. a ring that sends whole buffers --------------------------------------------------------
RING_CASES = {4: [16, 10, 3], 3: [12, 7, 2], 2: [8, 5]}


def check_ring_all_reduce(learner) -> str:
    for p, sizes in RING_CASES.items():
        labels = [f"world_size={p}, n={n} float64 elements" for n in sizes]
        got = learner.run_ranks(probe.ring_case, p, [(n,) for n in sizes], "ring_all_reduce",
                                labels)
        for i, (n, label) in enumerate(zip(sizes, labels)):
            want = probe.ring_sum(n, p)
            for r in range(p):
                x = got[r][i]["value"]
                if not _close(x, want, 0):
                    raise Mistake(f"with {label}: rank {r} ends with {values(x)}, the sum over "
                                  f"the ranks is {values(want)}")
            _judge_ring_bytes([got[r][i]["traffic"]["bytes_sent"] for r in range(p)], n, p,
                              label)
    return ("the exact sum on every rank, each rank sending at most 2(p-1) chunks of "
            "ceil(n/p) elements (2(p-1)/p·n), on 2, 3 and 4 ranks, n divisible or not")


def _judge_ring_bytes(sent: list[int], n: int, p: int, label: str) -> None:
    ideal = 2 * (p - 1) * n * 8 / p  # bytes: float64
    bound = 2 * (p - 1) * -(-n // p) * 8  # chunks of ceil(n / p)
    worst = max(range(p), key=lambda r: sent[r])
    if sent[worst] <= bound:
        return
    who = "each rank" if len(set(sent)) == 1 else f"rank {worst}"
    raise Mistake(f"with {label}: the sum is right, but {who} sent {sent[worst]} bytes, "
                  f"{sent[worst] / ideal:.1f}x the 2(p-1)/p·n = {ideal:g} bytes a ring sends "
                  f"(ranks 0 to {p - 1} sent {', '.join(map(str, sent))}): each of the 2(p-1) "
                  "steps "
                  "must send ONE chunk of n/p elements (the one this step passes on), not the "
                  "whole buffer")


# -- 3. found_inf not agreed -------------------------------------------------------------------
def check_sharded_step(learner) -> str:
    plan = probe.STEP_PLAN
    for p in (4, 2):
        got = learner.run_ranks(probe.sharded_case, p, [(plan,)], "sharded_step",
                                [f"world_size={p}"])
        got = [got[r][0]["value"] for r in range(p)]
        want = probe.sharded_oracle(p, plan)
        for k in range(plan["steps"]):
            _judge_sharded_step(got, want, k, p)
    return ("each rank's shard, the skipped steps and the scale equal one process holding "
            "every shard over 5 steps, one rank's gradients overflowing (inf, then NaN), on 4 "
            "and 2 ranks")


def _judge_sharded_step(got, want, k: int, p: int) -> None:
    where = f"with world_size={p}, step {k}"
    bad = probe.overflow(p).get(k)
    before = [got[r][k - 1]["param"] if k else probe.first_shard(r) for r in range(p)]
    stepped = [r for r in range(p) if not torch.equal(got[r][k]["param"], before[r])]
    skipped = [r for r in range(p) if r not in stepped]
    if stepped and skipped:
        cause = (f"only rank {bad[0]}'s gradients held {bad[1]}" if bad else
                 "no rank's gradients overflowed")
        raise Mistake(f"{where}: the ranks went separate ways: {ranks_text(skipped)} skipped "
                      f"the optimizer step that {ranks_text(stepped)} took ({cause}). Each rank "
                      "holds a different shard, so from now on the model's shards are out of "
                      "step and its loss scales differ. Agree on found_inf across the ranks "
                      "(all-reduce it with max) before deciding to skip")
    if bad and stepped:
        shard = values(got[bad[0]][k]["param"])
        raise Mistake(f"{where}: every rank took the step although rank {bad[0]}'s gradients "
                      f"held {bad[1]}: rank {bad[0]}'s shard is now {shard}. "
                      "Skip the step on every rank when ANY rank found an inf or NaN (max, "
                      "not min)")
    if not bad and skipped:
        raise Mistake(f"{where}: {ranks_text(skipped)} skipped a step where no gradient held "
                      "an inf or NaN")
    scales = [got[r][k]["scale"] for r in range(p)]
    if len(set(scales)) > 1 or scales[0] != want[k]["scale"]:
        raise Mistake(f"{where}: the loss scales are " + ", ".join(
            f"rank {r}: {s:g}" for r, s in enumerate(scales)) + f", expected {want[k]['scale']:g} "
            "on every rank: halve the scale on every rank that skips, and only then")
    for r in range(p):
        if not _close(got[r][k]["param"], want[k]["params"][r], 1e-12):
            raise Mistake(f"{where}: rank {r}'s shard is {values(got[r][k]['param'])}, expected "
                          f"{values(want[k]['params'][r])}: unscale (divide by the scale) and "
                          "step only when no rank overflowed")
        said = got[r][k]["stepped"]
        if said != want[k]["stepped"]:
            said = said["returned"] if isinstance(said, dict) else said
            raise Mistake(f"{where}: rank {r}'s sharded_step returned {said}, "
                          f"expected {want[k]['stepped']} (True when the optimizer stepped, "
                          "False when it skipped)")


# -- 4. a sampler without set_epoch ------------------------------------------------------------
SAMPLER_CASES = {2: (10, 3), 3: (11, 3)}  # world size -> (samples, epochs)


def check_train_epochs(learner) -> str:
    for p, (n, epochs) in SAMPLER_CASES.items():
        label = f"world_size={p}, {n} samples, {epochs} epochs"
        got = learner.run_ranks(probe.sampler_case, p, [(n, epochs)], "train_epochs", [label])
        for r in range(p):
            want = probe.sampler_oracle(n, r, p, epochs)
            _judge_epochs(got[r][0]["value"], want, r, label)
    return ("each rank visits its share of every epoch in torch's DistributedSampler order, a "
            "new order each epoch, on 2 and 3 ranks")


def _judge_epochs(seen: list[int], want: list[list[int]], r: int, label: str) -> None:
    size = len(want[0])
    if len(seen) != size * len(want):
        raise Mistake(f"with {label}: rank {r} trained on {len(seen)} samples, expected "
                      f"{size} per epoch for {len(want)} epochs ({size * len(want)})")
    epochs = [seen[e * size:(e + 1) * size] for e in range(len(want))]
    for e in range(1, len(want)):
        if epochs[e] == epochs[e - 1] and want[e] != want[e - 1]:
            raise Mistake(f"with {label}: on rank {r}, epoch {e - 1} and epoch {e} visit the "
                          f"samples in the same order ({_short(epochs[e])}): the sampler "
                          "shuffles with seed + epoch, and its epoch never changed. Call "
                          "sampler.set_epoch(epoch) at the start of every epoch, on every "
                          "rank")
    for e, (mine, theirs) in enumerate(zip(epochs, want)):
        if mine != theirs:
            same = " (epoch 0's order)" if mine == want[0] and e else ""
            raise Mistake(f"with {label}: in epoch {e} rank {r} visited {_short(mine)}{same}, "
                          f"torch's DistributedSampler with set_epoch({e}) gives "
                          f"{_short(theirs)}: set the epoch before iterating, to the epoch's "
                          "number")


def _short(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 8 else str(xs[:8])[:-1] + ", ...]"


# -- 5. a ZeRO shard off by the padding --------------------------------------------------------
ZERO_CASES = {4: [12, 10, 9, 5, 2], 3: [8, 7]}
LR = 0.5


def check_zero_sgd_step(learner) -> str:
    for p, sizes in ZERO_CASES.items():
        labels = [_zero_label(n, p) for n in sizes]
        got = learner.run_ranks(probe.zero_case, p, [(n, LR) for n in sizes], "zero_sgd_step",
                                labels)
        for i, (n, label) in enumerate(zip(sizes, labels)):
            start, grad = probe.zero_start(n), probe.zero_mean_grad(n, p)
            want = start - LR * grad
            for r in range(p):
                _judge_zero(got[r][i]["value"], want, start, grad, n, p, r, label)
    return ("every rank's parameters equal one SGD step on the mean gradient, for 2 to 12 "
            "parameters on 3 and 4 ranks (divisible, padded, shards left empty)")


def _zero_label(n: int, p: int) -> str:
    shard = -(-n // p)
    pad = shard * p - n
    return (f"n={n} parameters on {p} ranks (shards of {shard}" +
            (f", the last {pad} of the padded {shard * p} are padding)" if pad else ", no "
             "padding)"))


def _judge_zero(x, want, start, grad, n: int, p: int, r: int, label: str) -> None:
    if _close(x, want, 1e-12):
        return
    if not isinstance(x, torch.Tensor) or x.shape != want.shape:
        raise Mistake(f"with {label}: rank {r}'s parameters became {values(x)}; update them "
                      "in place, keeping their shape")
    shard = -(-n // p)
    wrong = [i for i in range(n) if abs(float(x[i] - want[i])) > 1e-12]
    owners = sorted({i // shard for i in wrong})
    notes = [f"[{i}] = {float(x[i]):.6g} ({_zero_why(x, i, start, grad)}expected "
             f"{float(want[i]):.6g})" for i in wrong[:3]]
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    raise Mistake(f"with {label}: after one step, rank {r}'s parameters {_indices(wrong)} are "
                  f"wrong: {'; '.join(notes)}{more}. In the padded layout they belong to "
                  f"{ranks_text(owners)}'s shard{'s' if len(owners) > 1 else ''} "
                  f"[r·{shard}, (r+1)·{shard}): reduce_scatter gave rank r the gradient of "
                  "exactly those positions, so update params[min(r·shard, n):min((r+1)·shard, "
                  "n)] with it, and put the update back at the same place")


def _zero_why(x, i: int, start, grad) -> str:
    v = float(x[i])
    if v == 0.0:
        return "a padding zero; "
    if abs(v - float(start[i])) < 1e-12:
        return "it did not move; "
    n = len(start)
    for j, k in [(j, k) for j in range(n) for k in range(n) if (j, k) != (i, i)]:
        if abs(v - (float(start[j]) - LR * float(grad[k]))) < 1e-12:
            who = "it" if j == i else f"parameter {j}"
            by = "its own gradient" if k == j else f"parameter {k}'s gradient"
            return f"{who} moved by {by}; "
    return ""


def _indices(ix: list[int]) -> str:
    return ", ".join(map(str, ix[:-1])) + f" and {ix[-1]}" if len(ix) > 1 else str(ix[0])


TESTS = [  # in notebook order
    GradedTest("test_average_gradients", 2, ("average_gradients",), check_average_gradients,
               (DATA_PARALLEL,)),
    GradedTest("test_ring_all_reduce", 2, ("ring_all_reduce",), check_ring_all_reduce,
               (COLLECTIVES,)),
    GradedTest("test_sharded_step", 2, ("sharded_step",), check_sharded_step, (AMP,)),
    GradedTest("test_train_epochs", 2, ("train_epochs",), check_train_epochs),
    GradedTest("test_zero_sgd_step", 2, ("zero_sgd_step",), check_zero_sgd_step, (ZERO,)),
    *STRETCH,
]
