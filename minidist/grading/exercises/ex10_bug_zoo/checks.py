"""Exercise 10's tests: each fixed function against its oracle on inputs that expose its bug,
the feedback naming the symptom as it shows in a run, then the cause. The stretch's two:
float16 training without loss scaling, graded against float32 gradients of the same problem
(Micikevicius et al., ICLR 2018), and a 1F1B step that deadlocks when there are fewer
micro-batches than stages, run on 2 and 4 stages (a deadlock is caught on the ranks and
named: who waits for what, after how many passes) and judged against one process running
the stages' layers in order (Narayanan et al., SOSP 2019)."""

from __future__ import annotations

import torch

from ...engine.feedback import Mistake, ranks_text, traffic_text, values
from . import ranks as probe
from .mistakes import average_hint, indices, short, zero_why
from .ranks import ZERO_LR as LR
from .ranks import close
from .ranks import close as _close


# -- 1. gradients summed, not averaged ---------------------------------------------------------
def _world(p: int, *_) -> str:
    return f"world_size={p}"


def check_average_gradients(learner) -> str:
    for p, _, _, results in learner.each_world(probe.average_case, "average_gradients",
                                               {2: [(0,)], 4: [(0,)]}, _world):
        want = probe.mean_grads(0, p)
        for r, result in enumerate(results):
            for name, g, w in zip(("weight", "bias"), result["value"], want):
                if _close(g, w):
                    continue
                raise Mistake(f"with world_size={p}: after average_gradients rank {r}'s "
                              f"{name} gradient is {values(g)}, one process on all {p} ranks' "
                              f"samples has {values(w)}: {average_hint(g, w, p, r)}")
    return ("every rank's gradients equal one process's on all ranks' samples, on 2 and 4 "
            "ranks")


# -- 2. a ring that sends whole buffers --------------------------------------------------------
RING_CASES = {4: [16, 10, 3], 3: [12, 7, 2], 2: [8, 5]}


def check_ring_all_reduce(learner) -> str:
    worlds = {p: [(n,) for n in sizes] for p, sizes in RING_CASES.items()}
    for p, (n,), label, results in learner.each_world(
            probe.ring_case, "ring_all_reduce", worlds,
            lambda p, n: f"world_size={p}, n={n} float64 elements"):
        want = probe.ring_sum(n, p)
        for r, result in enumerate(results):
            if not _close(result["value"], want, 0):
                raise Mistake(f"with {label}: rank {r} ends with {values(result['value'])}, "
                              f"the sum over the ranks is {values(want)}")
        _judge_ring_bytes([r["traffic"]["bytes_sent"] for r in results], n, p, label)
        _judge_ring_links([r["traffic"] for r in results], n, label)
    return ("the exact sum on every rank; each rank sends only to its right neighbour, "
            "2(p-1) chunks of floor or ceil(n/p) elements, and the ranks exactly 2(p-1)·n "
            "elements in all, on 2, 3 and 4 ranks, n divisible or not")


def _judge_ring_links(traffics: list[dict], n: int, label: str) -> None:
    """A ring: each rank sends only to its right neighbour, one chunk per step, 2(p-1)
    messages (fewer only where chunks are empty, n < p)."""
    p = len(traffics)
    for r, traffic in enumerate(traffics):
        right = (r + 1) % p
        to = {int(d): m for d, m in traffic["messages_to"].items() if m}
        if set(to) - {right}:
            raise Mistake(f"with {label}: rank {r} sent {traffic_text(traffic)}; in a ring "
                          f"every rank sends only to its right neighbour, rank {right}")
        if n >= p and to.get(right, 0) != 2 * (p - 1):
            raise Mistake(f"with {label}: rank {r} sent {traffic_text(traffic)}; a ring "
                          f"all_reduce sends one chunk per step: 2(p-1) = {2 * (p - 1)} "
                          "messages")


def _judge_ring_bytes(sent: list[int], n: int, p: int, label: str) -> None:
    """Exact: every chunk travels p-1 times in each phase, 2(p-1)·n elements in all, each
    rank's share 2(p-1) chunks of floor or ceil(n/p) elements (the chunking is the
    learner's)."""
    ideal = 2 * (p - 1) * n * 8 / p  # bytes: float64
    lo, hi = 2 * (p - 1) * (n // p) * 8, 2 * (p - 1) * -(-n // p) * 8
    total = 2 * (p - 1) * n * 8
    if sum(sent) == total and all(lo <= b <= hi for b in sent):
        return
    listed = f"(ranks 0 to {p - 1} sent {', '.join(map(str, sent))})"
    if sum(sent) < total:
        raise Mistake(f"with {label}: the sum is right, but the ranks sent {sum(sent)} bytes "
                      f"in all {listed}, fewer than the exactly 2(p-1)·n·8 = {total} of a "
                      "ring: each chunk travels p-1 times in each phase, in comm's messages "
                      "(a rank that sends less got its data some other way: a file, shared "
                      "memory)")
    worst = max(range(p), key=lambda r: sent[r])
    who = "each rank" if len(set(sent)) == 1 else f"rank {worst}"
    raise Mistake(f"with {label}: the sum is right, but {who} sent {sent[worst]} bytes, "
                  f"{sent[worst] / ideal:.1f}x the 2(p-1)/p·n = {ideal:g} bytes a ring sends "
                  f"{listed}: each of the 2(p-1) steps "
                  "must send ONE chunk of n/p elements (the one this step passes on), not the "
                  "whole buffer")


# -- 3. found_inf not agreed -------------------------------------------------------------------
def check_sharded_step(learner) -> str:
    plan = probe.STEP_PLAN
    for p, _, _, results in learner.each_world(probe.sharded_case, "sharded_step",
                                               {4: [(plan,)], 2: [(plan,)]}, _world):
        got = [r["value"] for r in results]
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
    worlds = {p: [case] for p, case in SAMPLER_CASES.items()}
    for p, (n, epochs), label, results in learner.each_world(
            probe.sampler_case, "train_epochs", worlds,
            lambda p, n, epochs: f"world_size={p}, {n} samples, {epochs} epochs"):
        for r, result in enumerate(results):
            _judge_epochs(result["value"], probe.sampler_oracle(n, r, p, epochs), r, label,
                          n, p)
    return ("each rank visits its share of every epoch in torch's DistributedSampler order, a "
            "new order each epoch, on 2 and 3 ranks")


def _judge_epochs(seen: list[int], want: list[list[int]], r: int, label: str, n: int,
                  p: int) -> None:
    size = len(want[0])
    if len(seen) != size * len(want):
        why = ""
        if len(seen) == n * len(want):
            why = (": every epoch it trained on the whole dataset, as every other rank did. "
                   "Each rank must draw only its share, through the DistributedSampler "
                   "(DataLoader(..., sampler=sampler), not shuffle=True)")
        elif len(seen) == (n // p) * len(want):
            why = (f": {n} samples on {p} ranks is {n // p} each, rounded down; the sampler "
                   f"pads (repeats the first samples) so that every rank gets ceil(n/p) = "
                   f"{size} per epoch and none is left out (drop_last=False)")
        raise Mistake(f"with {label}: rank {r} trained on {len(seen)} samples, expected "
                      f"{size} per epoch for {len(want)} epochs ({size * len(want)}){why}")
    epochs = [seen[e * size:(e + 1) * size] for e in range(len(want))]
    in_order = [(list(range(n)) * 2)[:size * p][r::p]] * len(want)
    if epochs == in_order:
        raise Mistake(f"with {label}: rank {r} visits {short(epochs[0])} in every epoch, the "
                      "samples in the dataset's order: the sampler must shuffle "
                      "(shuffle=True), with set_epoch(epoch) at the start of every epoch")
    for e in range(1, len(want)):
        if epochs[e] == epochs[e - 1] and want[e] != want[e - 1]:
            raise Mistake(f"with {label}: on rank {r}, epoch {e - 1} and epoch {e} visit the "
                          f"samples in the same order ({short(epochs[e])}): the sampler "
                          "shuffles with seed + epoch, and its epoch never changed. Call "
                          "sampler.set_epoch(epoch) at the start of every epoch, on every "
                          "rank")
    for e, (mine, theirs) in enumerate(zip(epochs, want)):
        if mine != theirs:
            same = " (epoch 0's order)" if mine == want[0] and e else ""
            raise Mistake(f"with {label}: in epoch {e} rank {r} visited {short(mine)}{same}, "
                          f"torch's DistributedSampler with set_epoch({e}) gives "
                          f"{short(theirs)}: set the epoch before iterating, to the epoch's "
                          "number")


# -- 5. a ZeRO shard off by the padding --------------------------------------------------------
ZERO_CASES = {4: [12, 10, 9, 5, 2], 3: [8, 7]}


def check_zero_sgd_step(learner) -> str:
    worlds = {p: [(n, LR) for n in sizes] for p, sizes in ZERO_CASES.items()}
    for p, (n, _), label, results in learner.each_world(
            probe.zero_case, "zero_sgd_step", worlds, lambda p, n, lr: _zero_label(n, p)):
        start, grad = probe.zero_start(n), probe.zero_mean_grad(n, p)
        want = start - LR * grad
        for r, result in enumerate(results):
            _judge_zero(result["value"]["params"], want, start, grad, n, p, r, label)
            _judge_zero_sharded(result["value"]["calls"], n, r, label)
            _judge_zero_counts(result["value"], want, grad, n, p, r, label)
    return ("every rank's parameters equal one SGD step on the mean gradient, for 2 to 12 "
            "parameters on 3 and 4 ranks (divisible, padded, shards left empty), the gradient "
            "reduce-scattered and the updated shards all-gathered, never all-reduced whole")


def _judge_zero_sharded(calls: list, n: int, r: int, label: str) -> None:
    """ZeRO's mechanism, not only its numbers: a fix that all-reduces the whole gradient
    and updates every parameter on every rank is data parallelism, not ZeRO."""
    names = [name for name, _ in calls]
    dense = [k for name, k in calls if name == "all_reduce" and k >= n]
    if dense or "all_gather" not in names:
        what = (f"all-reduced {dense[0]} elements (the whole gradient)" if dense else
                f"called {', '.join(f'md.{x}' for x in names) or 'no collective'} and no "
                "md.all_gather")
        raise Mistake(f"with {label}: the parameters are right, but rank {r} {what}: that is "
                      "data parallelism, every rank updating every parameter. ZeRO's point is "
                      "the sharding: reduce-scatter the gradient, update only this rank's "
                      "shard, all-gather the updated shards; keep that mechanism and fix the "
                      "shard's bounds")


def _judge_zero_counts(value: dict, want, grad, n: int, p: int, r: int, label: str) -> None:
    """Exact: one md.reduce_scatter of the padded gradient (shard·p elements; n where the
    learner's layout is torch's uneven split) and one md.all_gather of this rank's updated
    shard (shard elements), nothing else; and what the all_gather sent is parameters after
    the step, not the gradient (a fix that gathers the gradient and updates every parameter
    on every rank is data parallelism with extra steps)."""
    shard = -(-n // p)
    calls = [(name, k) for name, k in value["calls"]]
    wrong_gather = [k for name, k in calls if name == "all_gather" and k != shard]
    if calls not in ([("reduce_scatter", shard * p), ("all_gather", shard)],
                     [("reduce_scatter", n), ("all_gather", shard)]):
        listing = ", ".join(f"md.{name} ({k} elements)" for name, k in calls)
        what = (f"all-gathered {wrong_gather[0]} elements, not its shard's {shard}"
                if wrong_gather else f"called {listing}")
        raise Mistake(f"with {label}: the parameters are right, but rank {r} {what}: ZeRO's "
                      f"step is exactly one md.reduce_scatter of the padded gradient "
                      f"({shard * p} elements) and one md.all_gather of this rank's updated "
                      f"shard ({shard} elements), in that order; anything more is traffic "
                      "(and memory) that the sharding is there to save")
    piece = value["gathered"][0].flatten().double() if value["gathered"] else None
    if piece is None or not piece.numel():
        return
    params = [float(v) for v in want]
    if all(float(v) == 0.0 or min(abs(float(v) - w) for w in params) < 1e-12 for v in piece):
        return
    padded = torch.zeros(shard * p, dtype=torch.float64)
    padded[:n] = grad
    mine = padded[r * shard:(r + 1) * shard]
    what = ("its shard of the gradient" if close(piece, mine, 1e-12) else
            f"{values(piece)}, which are not parameters after the step")
    raise Mistake(f"with {label}: the parameters are right, but rank {r} all-gathered {what}, "
                  "so every rank then updated every parameter: that is data parallelism "
                  "again, every rank holding the whole update. ZeRO all-gathers the "
                  "updated shards of the parameters: update only this rank's shard, then "
                  "all-gather it")


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
    notes = [f"[{i}] = {float(x[i]):.6g} ({zero_why(x, i, start, grad, p)}expected "
             f"{float(want[i]):.6g})" for i in wrong[:3]]
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    raise Mistake(f"with {label}: after one step, rank {r}'s parameters {indices(wrong)} are "
                  f"wrong: {'; '.join(notes)}{more}. In the padded layout they belong to "
                  f"{ranks_text(owners)}'s shard{'s' if len(owners) > 1 else ''} "
                  f"[r·{shard}, (r+1)·{shard}): reduce_scatter gave rank r the gradient of "
                  "exactly those positions, so update params[min(r·shard, n):min((r+1)·shard, "
                  "n)] with it, and put the update back at the same place")


# -- the stretch ------------------------------------------------------------------------------
# -- 6. float16 without loss scaling -----------------------------------------------------------
def check_fp16_step(learner) -> str:
    for p, _, _, results in learner.each_world(probe.fp16_case, "fp16_step",
                                               {1: [()], 2: [()]},
                                               lambda p: f"world_size={p}"):
        want = probe.fp16_oracle(p)
        own = [probe.fp16_oracle(p, [r]) for r in range(p)]
        start = [w.detach().float() for w in probe.fp16_model().parameters()]
        for k in range(probe.FP16["steps"]):
            for r, result in enumerate(results):
                _judge_fp16(result["value"][k], want[k], start, k, p, r, own[r][k])
    return ("the float32 master weights move as float32 gradients move them (within 2%) over "
            "2 steps, output gradients ~2^-26 (below float16's smallest subnormal), on 1 and 2 "
            "ranks")


def _judge_fp16(masters, want, start, k: int, p: int, r: int, own=None) -> None:
    where = f"with world_size={p}, after step {k}"
    own = own or [None] * len(want)
    for name, w, ref, w0, alone in zip(("weight", "bias"), masters, want, start, own):
        if not isinstance(w, torch.Tensor) or w.shape != ref.shape:
            raise Mistake(f"{where}: rank {r}'s master {name} is {values(w)}; update the "
                          "masters in place (optimizer.step())")
        if not torch.isfinite(w).all():
            raise Mistake(f"{where}: rank {r}'s master {name} is {values(w)}: the scaled "
                          "float16 gradients overflowed to inf (float16's largest value is "
                          "65504), so the scale is too large. 2**16 lifts the ~2^-26 "
                          "gradients into float16's range without overflowing them")
        moved, should = (w - w0).double(), (ref - w0).double()
        if torch.linalg.norm(moved - should) <= 0.02 * torch.linalg.norm(should):
            continue
        size = float(torch.linalg.norm(should))
        ratio = float((moved * should).sum() / (should * should).sum())
        if float(torch.linalg.norm(moved)) < 1e-3 * size:
            raise Mistake(f"{where}: rank {r}'s float32 master {name} has not moved (the "
                          f"float32 gradient moves it by {size:.2g}): every float16 gradient "
                          "underflowed to 0. The loss's gradient at the output is ~2^-26 "
                          "≈ 1.5e-8 per element, below float16's smallest subnormal (2^-24 ≈ "
                          "6e-8), so backward rounds it to 0 as it enters float16. Multiply "
                          "the loss by a scale (2**16, say) before backward, and divide the "
                          "gradients by it in float32, before the step (unscaling in "
                          "float16 underflows the same way: convert first, then divide)")
        if p > 1 and abs(ratio - p) < 0.05 and close(moved, ratio * should, 0.05):
            raise Mistake(f"{where}: rank {r}'s master {name} moved {ratio:.3g}x as far as "
                          f"the float32 gradient moves it, {p} ranks: the gradients were "
                          "summed over the ranks, not averaged: all-reduce them with "
                          'op="avg"')
        if k and abs(ratio - (k + 2) / 2) < 0.05 and close(moved, ratio * should, 0.05):
            raise Mistake(f"{where}: rank {r}'s master {name} moved {ratio:.3g}x as far as "
                          "the float32 gradient moves it: each step's float16 gradients "
                          "were added to the last step's (backward accumulates into .grad): "
                          "clear them (p.grad = None) once they are copied to the masters")
        alone_moved = None if alone is None else (alone - w0).double()
        if alone_moved is not None and p > 1 and torch.linalg.norm(moved - alone_moved) \
                <= 0.02 * torch.linalg.norm(alone_moved):
            raise Mistake(f"{where}: rank {r}'s master {name} moved as this rank's own "
                          "gradient alone moves it: the ranks' gradients were not averaged, "
                          "so the replicas drift apart: all-reduce them (op=\"avg\") before "
                          "the step")
        if ratio > 2 and close(moved, ratio * should, 0.02):
            raise Mistake(f"{where}: rank {r}'s master {name} moved {ratio:.4g}x as far as "
                          "the float32 gradient moves it: the gradients still hold the "
                          "scale: divide them by it (in float32) before optimizer.step()")
        off = float(torch.linalg.norm(moved - should)) / size
        raise Mistake(f"{where}: rank {r}'s master {name} is {values(w)}, float32 gradients "
                      f"give {values(ref)} (your update is {off:.0%} off theirs): scale the "
                      "loss before backward, convert the float16 gradients to float32, "
                      "THEN divide by the scale (in float16 the division underflows again), "
                      "average over the ranks, step")


# -- 7. a 1F1B step that deadlocks -------------------------------------------------------------
PIPE_CASES = {2: [1, 3], 4: [4, 2, 1, 6]}  # stages -> micro-batch counts, in this order


def check_pipeline_1f1b(learner) -> str:
    worlds = {p: [(m,) for m in counts] for p, counts in PIPE_CASES.items()}
    for p, (m,), label, results in learner.each_world(
            probe.pipeline_case, "pipeline_1f1b", worlds,
            lambda p, m: f"{m} micro-batch{'es' if m > 1 else ''} on {p} stages"):
        ranks = [r["value"] for r in results]
        _judge_deadlock(ranks, m, p)
        _judge_pipeline(ranks, probe.pipeline_oracle(p, m), m, p, label)
        _judge_schedule(ranks, m, p, label)
    return ("no deadlock, each stage's forwards and backwards in 1F1B's order, and the loss "
            "and every stage's gradients of one process running the stages in order, for 1 to "
            "6 micro-batches on 2 and 4 stages (fewer micro-batches "
            "than stages too)")


def one_f_one_b_order(r: int, p: int, m: int) -> str:
    """Stage r's forwards and backwards under 1F1B: min(p-r-1, m) warm-up forwards, then
    one forward and one backward, then the cool-down's backwards."""
    warm = min(p - r - 1, m)
    return "F" * warm + "FB" * (m - warm) + "B" * warm


def _judge_schedule(ranks: list[dict], m: int, p: int, label: str) -> None:
    """The schedule's signature: a fix that swaps 1F1B for another schedule (GPipe's all
    forwards first, or one micro-batch at a time) computes the same gradients."""
    for r, out in enumerate(ranks):
        want, got = one_f_one_b_order(r, p, m), out.get("order", "")
        if got == want:
            continue
        flight = peak = 0
        for kind in got:
            flight += 1 if kind == "F" else -1
            peak = max(peak, flight)
        raise Mistake(f"with {label}: the loss and gradients are right, but stage {r} ran "
                      f"{' '.join(got)} (up to {peak} micro-batch(es) in flight), where 1F1B "
                      f"runs {' '.join(want)} (at most min(p - r, m) = {min(p - r, m)} in "
                      "flight): keep the 1F1B schedule (warm-up, one forward one backward, "
                      "cool-down) and fix its warm-up bound")


def _judge_deadlock(ranks: list[dict], m: int, p: int) -> None:
    blocked = [r for r, out in enumerate(ranks) if "blocked" in out]
    if not blocked:
        return
    parts = []
    for r in blocked:
        op, peer = ranks[r]["blocked"]["op"], ranks[r]["blocked"]["peer"]
        f, b = ranks[r]["F"], ranks[r]["B"]
        what = ("a gradient from" if peer == r + 1 else "an activation from") \
            if "recv" in op else "its message to be received by"
        parts.append(f"stage {r} ran {f} forward and {b} backward passes and waits in {op} for "
                     f"{what} stage {peer}")
    free = [r for r in range(p) if r not in blocked]
    finished = f"; {ranks_text(free).replace('rank', 'stage')} finished" if free else ""
    raise Mistake(f"the schedule deadlocks at m={m} micro-batch{'es' if m > 1 else ''} on {p} "
                  f"stages: {'; '.join(parts)}{finished}. Stage r can have at most m "
                  "micro-batches in flight: with fewer micro-batches than stages, its "
                  "warm-up (p - r - 1 forwards) is cut to m, and so must be its cool-down, or "
                  "it waits for a gradient that never comes")


def _judge_pipeline(ranks: list[dict], want: dict, m: int, p: int, label: str) -> None:
    last = ranks[p - 1]
    if not isinstance(last.get("loss"), float) or abs(last["loss"] - want["loss"]) > 1e-9:
        raise Mistake(f"with {label}: the last stage returned the loss {last.get('loss')!r}, "
                      f"one process gives {want['loss']:.10g} (the sum over the micro-batches)")
    for r in range(p):
        for name, g, w in zip(("weight", "bias"), ranks[r]["grads"], want["grads"][r]):
            if not close(g, w, 1e-9):
                runs = f"it ran {ranks[r]['F']} forward and {ranks[r]['B']} backward passes"
                raise Mistake(f"with {label}: stage {r}'s {name} gradient is {values(g)}, one "
                              f"process gives {values(w)} ({runs}; expected {m} of each)")
