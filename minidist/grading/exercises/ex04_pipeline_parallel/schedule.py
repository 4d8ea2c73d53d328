"""Exercise 04's schedule test: one stage's 1F1B action list, judged by running every
stage's list against the others.

The test calls the learner's ``one_f_one_b(rank, stages, microbatches)`` for every
rank of a pipeline and simulates the lists together, as the runtime would run them: stage r
may run ``("F", i)`` once stage r - 1 has run ``("F", i)`` (the activation has arrived) and
``("B", i)`` once stage r + 1 has run ``("B", i)`` (the gradient has arrived); sends never
block. The lists must be complete (each micro-batch forwarded, then backwarded, once),
deadlock-free, in one order on every stage (messages arrive in the order they are sent),
within 1F1B's memory bound (at most min(p - r, m) micro-batches in flight on stage r), with
its warm-up (p - r - 1 forwards before the steady phase), and in the end 1F1B itself
(PipeDream-Flush, Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training",
ICML 2021). The simulator and the reference schedule (``ranks.reference_1f1b``) are the
grader's own, an oracle independent of ``md.pipeline``.
"""

from __future__ import annotations

import numbers
from collections import Counter

from ...engine.feedback import Mistake, describe_remote
from ...engine.isolation import RemoteError
from ...engine.learner import each_call
from .ranks import reference_1f1b

Action = tuple[str, int]
CASES = [(4, 8), (2, 5), (3, 7), (4, 3), (3, 3), (2, 2), (2, 1), (3, 2), (5, 9), (5, 2),
         (8, 16), (8, 3), (1, 3), (1, 1)]  # (stages, microbatches); the telling ones first


def check_one_f_one_b(learner) -> str:
    calls = [(r, p, m) for p, m in CASES for r in range(p)]
    results = iter(learner.call(each_call, "one_f_one_b", calls, name="one_f_one_b"))
    for p, m in CASES:
        lists = [_as_actions(_value(next(results), r, p, m), r, p, m) for r in range(p)]
        problem = schedule_problem(lists, m)
        if problem:
            raise Mistake(f"with stages={p}, microbatches={m}: {problem}")
    return (f"deadlock-free, complete, within 1F1B's memory bound and 1F1B's order on every "
            f"stage, in {len(CASES)} pipelines of 1 to 8 stages and 1 to 16 micro-batches")


def _value(result, r: int, p: int, m: int):
    kind, value = result
    if kind == "error":
        raise Mistake(describe_remote(RemoteError(**value), "one_f_one_b",
                                      f"rank={r}, stages={p}, microbatches={m}"))
    return value


def _as_actions(result, rank: int, p: int, m: int) -> list[Action]:
    """The result as a list of ("F" | "B", int): from lists or tuples alike."""
    head = f"one_f_one_b({rank}, {p}, {m}) returned"
    if not isinstance(result, (list, tuple)):
        raise Mistake(f"{head} {result!r:.80}, expected a list of actions such as "
                      "[('F', 0), ('F', 1), ('B', 0), ...]")
    out = []
    for k, a in enumerate(result):
        ok = isinstance(a, (list, tuple)) and len(a) == 2 and a[0] in ("F", "B") and \
            isinstance(a[1], numbers.Integral) and not isinstance(a[1], bool)
        if not ok:
            raise Mistake(f"{head} {a!r:.40} at list[{k}]: each action is a pair ('F', i) or "
                          "('B', i), i the micro-batch's number")
        if not 0 <= a[1] < m:
            few = (" (with fewer micro-batches than stages the warm-up is shorter: "
                   "min(p - r - 1, m) forwards)") if m < p else ""
            raise Mistake(f"{head} {_show(a)} at list[{k}], but there are {m} micro-batches, "
                          f"numbered 0 to {m - 1}{few}")
        out.append((a[0], int(a[1])))
    return out


def _show(a) -> str:
    return f"('{a[0]}', {a[1]})"


def schedule_problem(lists: list[list[Action]], m: int) -> str | None:
    """The first thing wrong with the stages' lists, as a sentence; None if they are 1F1B."""
    for check in (_each_once, _forward_first, _deadlock, _same_order, _in_flight, _warm_up,
                  _is_1f1b):
        problem = check(lists, m)
        if problem:
            return problem
    return None


def _each_once(lists, m) -> str | None:
    for r, acts in enumerate(lists):
        for kind, verb in (("F", "forwards"), ("B", "backwards")):
            count = Counter(i for k, i in acts if k == kind)
            twice = [i for i in range(m) if count[i] > 1]
            if twice:
                at = [k for k, a in enumerate(acts) if a == (kind, twice[0])]
                return (f"stage {r} {verb} micro-batch {twice[0]} {count[twice[0]]} times (at "
                        f"list{at}); every stage {verb[:-1]}s each micro-batch exactly once")
            missing = [i for i in range(m) if not count[i]]
            if missing:
                return (f"stage {r} never {verb} micro-batch{'es' if len(missing) > 1 else ''}"
                        f" {', '.join(map(str, missing))}; every stage forwards, then "
                        "backwards, each micro-batch exactly once")
    return None


def _forward_first(lists, m) -> str | None:
    for r, acts in enumerate(lists):
        for k, (kind, i) in enumerate(acts):
            if kind == "B" and acts.index(("F", i)) > k:
                return (f"micro-batch {i} backwarded before its forward on stage {r}: "
                        f"('B', {i}) is at list[{k}], ('F', {i}) only at list"
                        f"[{acts.index(('F', i))}]; a backward needs the activations its "
                        "forward kept")
    return None


def simulate(lists) -> list[int]:
    """How far each stage gets: stage r runs ("F", i) once stage r - 1 has, ("B", i) once
    stage r + 1 has (the message has arrived); sends never block."""
    p, done, pos, moved = len(lists), [set() for _ in lists], [0] * len(lists), True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(lists[r]):
                peer = _waits_on(lists, r, pos[r])
                if peer is not None and lists[r][pos[r]] not in done[peer]:
                    break
                done[r].add(lists[r][pos[r]])
                pos[r], moved = pos[r] + 1, True
    return pos


def _waits_on(lists, r: int, k: int) -> int | None:
    """The stage whose message stage r's action k needs (None: the first stage's forward,
    the last stage's backward)."""
    kind = lists[r][k][0]
    peer = r - 1 if kind == "F" else r + 1
    return peer if 0 <= peer < len(lists) else None


def _deadlock(lists, m) -> str | None:
    pos = simulate(lists)
    for a in range(len(lists)):
        if pos[a] == len(lists[a]):
            continue
        b = _waits_on(lists, a, pos[a])
        if pos[b] < len(lists[b]) and _waits_on(lists, b, pos[b]) == a:
            lo, hi = sorted((a, b))
            return (f"deadlock between stages {lo} and {hi}: {_waiting(lists, lo, hi, pos)}; "
                    f"{_waiting(lists, hi, lo, pos)}. Each waits for a message the other "
                    "sends only later in its list")
    return None  # complete lists on a line of stages cannot block otherwise


def _waiting(lists, r: int, peer: int, pos) -> str:
    kind, i = lists[r][pos[r]]
    what = "activation" if kind == "F" else "gradient"
    sent = lists[peer].index((kind, i))
    return (f"stage {r} waits at its list[{pos[r]}] = {_show((kind, i))} for micro-batch "
            f"{i}'s {what}, which stage {peer} sends only at its list[{sent}] = "
            f"{_show((kind, i))}")


def _same_order(lists, m) -> str | None:
    for kind, verb in (("F", "forwards"), ("B", "backwards")):
        orders = [[i for k, i in acts if k == kind] for acts in lists]
        for r in range(1, len(lists)):
            if orders[r] != orders[r - 1]:
                what = "activations" if kind == "F" else "gradients"
                return (f"stage {r} {verb} the micro-batches in the order {orders[r]}, stage "
                        f"{r - 1} in the order {orders[r - 1]}: {what} arrive in the order "
                        f"they are sent, so every stage must {verb[:-1]} in the same order")
    return None


def _in_flight(lists, m) -> str | None:
    p = len(lists)
    for r, acts in enumerate(lists):
        bound, held = min(p - r, m), 0
        for k, (kind, _) in enumerate(acts):
            held += 1 if kind == "F" else -1
            if held > bound:
                rule = f"p - r = {p - r}" if p - r <= m else f"min(p - r, m) = {bound}"
                return (f"stage {r} holds {held} micro-batches in flight at its list[{k}] "
                        f"(forwarded, not yet backwarded: each one's activations are kept in "
                        f"memory), where the bound is {rule}: it "
                        f"{_warm_up_text(acts, r, p, m)}")
    return None


def _warm_up_text(acts, r: int, p: int, m: int) -> str:
    got = next((k for k, a in enumerate(acts) if a[0] == "B"), len(acts))
    want = min(p - r, m)
    if got == m and m > want:
        return "runs every forward before its first backward, as GPipe does"
    head = f"runs {got} forward{'s' if got != 1 else ''} before its first backward"
    if got != want and want < p - r:
        return (f"{head}, where 1F1B runs min(p - r, m) = {want}: with only {m} "
                "micro-batch(es), all of them")
    if got != want:
        return (f"{head}, where 1F1B runs {want}: a warm-up of p - r - 1 = {p - r - 1}, then "
                "the steady phase's first forward")
    return ("has the right warm-up, but after it each forward must be followed by a "
            "backward, which frees one micro-batch's activations")


def _warm_up(lists, m) -> str | None:
    p = len(lists)
    for r, acts in enumerate(lists):
        got = next((k for k, a in enumerate(acts) if a[0] == "B"), len(acts))
        if got != min(p - r, m):
            return (f"stage {r} {_warm_up_text(acts, r, p, m)}. With fewer, the pipeline "
                    f"never fills: stage {r} waits idle for a gradient while it could "
                    "compute the next forward")
    return None


def _is_1f1b(lists, m) -> str | None:
    p = len(lists)
    for r, acts in enumerate(lists):
        want = reference_1f1b(r, p, m)
        k = next((k for k, (a, b) in enumerate(zip(acts, want)) if a != b), None)
        if k is not None:
            return (f"stage {r}'s list differs from 1F1B at list[{k}]: {_show(acts[k])} where "
                    f"1F1B has {_show(want[k])}. After the warm-up, each forward is followed "
                    "by the backward of the oldest micro-batch in flight, until every "
                    "micro-batch has been forwarded; the cool-down then backwards the rest, "
                    "oldest first")
    return None

