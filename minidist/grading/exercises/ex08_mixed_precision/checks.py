"""Exercise 08's tests: the loss scale's schedule against ``torch.amp.GradScaler`` step by
step, the ranks' agreement on found_inf, and the steps that skip, on every rank together,
against one process holding every rank's piece under one torch scaler."""

from __future__ import annotations

import torch

from ...engine.compare import close
from ...engine.feedback import Mistake, ranks_text, values
from .mistakes import FLOAT32, schedule_mistake, value_hint
from .ranks import (
    MASTER_PLAN,
    SCHEDULE_CASES,
    STEP_PLAN,
    agree_case,
    initial_shard,
    overflows,
    schedule_run,
    step_case,
    torch_schedule,
    torch_steps,
)

AGREE_WORLDS, STEP_WORLDS, MASTER_WORLDS = (1, 2, 3, 4), (1, 2, 4), (1, 3)


# -- part 1: the schedule --------------------------------------------------------------------
def check_update_scale(learner) -> str:
    for label, init, growth, backoff, interval, flags in SCHEDULE_CASES:
        got = learner.call(schedule_run, init, growth, backoff, interval, flags,
                           name="update_scale", case=label)
        want = torch_schedule(init, growth, backoff, interval, flags)
        before, reset_on_growth = (init, 0), False
        for k, w in enumerate(want):
            g = got[k]
            if isinstance(g, dict):
                raise Mistake(f"with {label}: at step {k} update_scale returned "
                              f"{g['returned']}; return the pair (scale, growth_tracker)")
            g = (float(g[0]), int(g[1]))
            if g != w:
                raise Mistake(f"with {label}: " + schedule_mistake(
                    k, before, bool(flags[k]), g, w, (growth, backoff, interval),
                    reset_on_growth))
            reset_on_growth |= not flags[k] and g[0] > before[0] and g[1] == 0
            before = g
    return ("torch.amp.GradScaler's scale and growth tracker at every step of 4 sequences "
            "with overflows (torch's defaults over 4010 steps, growth_interval 3 and 2, "
            "other growth and backoff factors, a growth_factor of inf that must not be "
            "applied)")


# -- part 2: the agreement -------------------------------------------------------------------
def _agree_cases(p: int) -> list[list[int]]:
    cases = [[0] * p] + [[int(r == j) for r in range(p)] for j in range(p)]
    return cases + ([[1] * p] if p > 1 else [])


def _flags_text(flags: list[int]) -> str:
    found = [r for r, f in enumerate(flags) if f]
    if not found:
        return "no rank found an inf"
    return "every rank found an inf" if len(found) == len(flags) and len(flags) > 1 else \
        f"only {ranks_text(found)} found an inf"


def check_agree_found_inf(learner) -> str:
    worlds, judged = {p: [(c,) for c in _agree_cases(p)] for p in AGREE_WORLDS}, []
    for _, (flags,), label, results in learner.each_world(
            agree_case, "agree_found_inf", worlds,
            lambda p, flags: f"world_size={p}, {_flags_text(flags)}"):
        calls = [r["value"]["calls"] for r in results]
        _judge_agreement([r["value"]["flag"] for r in results], flags, label, calls)
        judged.append((results, calls, label))
    for results, calls, label in judged:  # the values first: a wrong answer's hint names them
        _judge_calls(results, calls, label)
    return ("every rank returns True exactly when some rank found an inf, on 1 to 4 ranks, "
            "whichever rank it is, with exactly one md.all_reduce of one value")


def _one_all_reduce(calls: list[dict]) -> bool:
    return len(calls) == 1 and calls[0]["numel"] == 1 and \
        calls[0]["name"] in ("all_reduce", "all_reduce_coalesced")


def _calls_text(calls: list[dict]) -> str:
    return ", ".join(f"md.{c['name']} of {c['numel']} value{'s' * (c['numel'] != 1)}"
                     + (f" (op={c['op']!r})" if c["name"] == "all_reduce" else "")
                     for c in calls) or "no md collective"


def _judge_calls(results: list[dict], calls: list[list[dict]], label: str) -> None:
    """Exactly one md.all_reduce of one value on every rank (on one rank there is nothing
    to agree on: no call is needed)."""
    if len(results) == 1:
        return
    for r, mine in enumerate(calls):
        if _one_all_reduce(mine):
            continue
        sent = sum(results[r]["traffic"]["messages_to"].values())
        head = (f"with {label}: the answers were right, but rank {r} called "
                f"{_calls_text(mine)}")
        if not mine:
            raise Mistake(f"{head} and sent {sent} message(s) by hand: agreeing on a flag "
                          "is one collective, md.all_reduce(comm, flag, op=\"max\") on a "
                          "one-element tensor, which the library runs in the fewest steps")
        if any(c["name"] != "all_reduce" for c in mine):
            raise Mistake(f"{head}, where exactly one md.all_reduce of one value (op=\"max\", "
                          "or a sum > 0) gives every rank the answer: a gather or broadcast "
                          "on top of it, or in its place, costs more latency and bytes "
                          "every step")
        if len(mine) > 1:
            raise Mistake(f"{head}: one all-reduce of the flag suffices; every extra one "
                          "is another collective's latency at every step")
        raise Mistake(f"{head}: the flag is one value (1.0 or 0.0) whatever the world "
                      "size; all-reduce a one-element tensor, not one slot per rank")


def _judge_agreement(got: list, flags: list[int], label: str, calls: list) -> None:
    for r, g in enumerate(got):
        if isinstance(g, dict):
            raise Mistake(f"with {label}: rank {r} returned {g['returned']}; return a bool")
    want = any(flags)
    said_true = [r for r, g in enumerate(got) if g]
    said_false = [r for r, g in enumerate(got) if not g]
    if said_true and said_false:
        raise Mistake(f"ranks disagreed with {label}: {ranks_text(said_true)} returned True, "
                      f"{ranks_text(said_false)} returned False, so some would skip the step "
                      "and others take it, and the replicas diverge for good. "
                      + ("Your md.all_reduce of the flag ran, but what the ranks returned "
                         "is not its result: return the reduced tensor's value "
                         "(md.all_reduce works in place), not the local found_inf"
                         if all(map(_one_all_reduce, calls)) else
                         "All-reduce found_inf with op=\"max\" so that every rank gets the "
                         "same answer"))
    if bool(got[0]) != want:
        hint = ("max over the ranks (or a sum > 0) is True when ANY rank found one; min is "
                "True only when all did" if want else
                "True only when some rank found an inf or NaN")
        if want and any(c["name"] == "broadcast" for c in calls[0]) and \
                not any(c["name"] == "all_reduce" for c in calls[0]):
            hint = ("a broadcast hands every rank the src rank's flag and drops the "
                    "others': " + hint)
        raise Mistake(f"with {label}: every rank returned {bool(got[0])}, expected {want}: "
                      f"{hint}")


# -- parts 3 and 4: a step that skips, on every rank together ---------------------------------
def check_scaled_step(learner) -> str:
    _run_steps(learner, "scaled_step", STEP_WORLDS, STEP_PLAN, master=False)
    return ("parameters, skipped steps, scale and tracker equal one process under "
            "torch.amp.GradScaler at each of 10 steps of SGD with momentum, 1, 2 and 4 ranks "
            "each holding its own piece, one rank's gradients overflowing (inf, NaN)")


def check_master_step(learner) -> str:
    _run_steps(learner, "master_step", MASTER_WORLDS, MASTER_PLAN, master=True)
    return ("float32 master weights and the float16 model equal torch.amp.GradScaler's "
            "step on float32 masters at each of 8 steps, gradients ~2^-20 (below float16's "
            "normal range unscaled), updates below float16's resolution, on 1 and 3 ranks")


def _run_steps(learner, name: str, worlds, plan: dict, master: bool) -> None:
    for p, _, label, results in learner.each_world(
            step_case, name, {p: [(plan, master)] for p in worlds},
            lambda p, *_: f"world_size={p}"):
        got = [r["value"] for r in results]
        want = torch_steps(p, plan, master)
        for k in range(plan["steps"]):
            where = f"with {label}, step {k}"
            _judge_skip(got, want, k, p, plan, where)
            _judge_values(got, want, k, p, plan, master, where)
            _judge_state(got, want, k, p, plan, where)
            for r in range(p):
                if got[r][k]["stepped"] != want[k]["stepped"]:
                    raise Mistake(f"{where}: rank {r}'s {name} returned "
                                  f"{got[r][k]['stepped']!r}, expected {want[k]['stepped']} "
                                  "(True when the optimizer stepped, False when it skipped)")


def _before(got, r: int, k: int) -> torch.Tensor:
    return got[r][k - 1]["param"] if k else initial_shard(r)


def _judge_skip(got, want, k: int, p: int, plan: dict, where: str) -> None:
    changed = [r for r in range(p) if not torch.equal(got[r][k]["param"], _before(got, r, k))]
    kept = [r for r in range(p) if r not in changed]
    bad = overflows(p, plan["steps"]).get(k)
    if bad and changed and kept:
        raise Mistake(f"ranks disagreed on skipping at step {k}: {ranks_text(kept)} skipped, "
                      f"{ranks_text(changed)} stepped (only rank {bad[0]}'s gradients held "
                      f"{bad[1]}, world_size={p}). A rank sees only its own gradients: "
                      "all-reduce found_inf with max (agree_found_inf) so that every rank "
                      "skips the same steps")
    if bad and changed:
        raise Mistake(f"{where}: did not skip the step at overflow: the parameters changed "
                      f"at step {k} where the gradients of rank {bad[0]} held {bad[1]} "
                      f"({ranks_text(changed)} stepped). On found_inf, do not call "
                      "optimizer.step() at all (zeroing the gradients and stepping still "
                      "moves the weights through momentum)")
    if not bad and kept:
        raise Mistake(f"{where}: {ranks_text(kept)} skipped a step where no rank's "
                      "gradients held an inf or NaN: skip only when found_inf is True")


def _judge_values(got, want, k: int, p: int, plan: dict, master: bool, where: str) -> None:
    for r in range(p):
        mine, ref = got[r][k]["param"], want[k]["params"][r]
        if not close(mine, ref, FLOAT32):
            raise Mistake(f"{where}: rank {r}'s {'master ' if master else ''}parameters are "
                          f"{values(mine)}, expected {values(ref)}; "
                          f"{value_hint(got, want, k, r, plan, master)}")
        if master:
            model, ref16 = got[r][k]["model"], ref.half()
            if not torch.equal(model, ref16):
                hint = ("the float16 model was not updated: copy the master weights back "
                        "into it after the step (model.data.copy_(master))"
                        if torch.equal(model, initial_shard(r).half()) else
                        "after the step the float16 model holds the master weights rounded "
                        "to float16 (model.data.copy_(master))")
                raise Mistake(f"{where}: rank {r}'s float16 model holds {values(model)}, "
                              f"expected {values(ref16)}; {hint}")


def _judge_state(got, want, k: int, p: int, plan: dict, where: str) -> None:
    w = (want[k]["scale"], want[k]["tracker"])
    before = (want[k - 1]["scale"], want[k - 1]["tracker"]) if k else (plan["init_scale"], 0)
    states = [(got[r][k]["scale"], got[r][k]["tracker"]) for r in range(p)]
    if len(set(map(str, states))) > 1:
        raise Mistake(f"{where}: the ranks' loss scales parted ways: "
                      + ", ".join(f"rank {r} has scale={s[0]}, growth_tracker={s[1]}"
                                  for r, s in enumerate(states))
                      + "; every rank must update its scale from the agreed found_inf")
    s = states[0]
    clean = overflows(p, plan["steps"]).get(k) is None  # a clean step always changes it
    if clean and s == (before[0], float(before[1])):
        raise Mistake(f"{where}: state['scale'] and state['growth_tracker'] did not change "
                      f"(torch's became scale={w[0]:g}, growth_tracker={w[1]}): store "
                      "update_scale's result in them at every step")
    if not all(isinstance(x, float) for x in s):
        raise Mistake(f"{where}: state['scale'] and state['growth_tracker'] hold {s[0]} and "
                      f"{s[1]}; keep them numbers (update_scale's result)")
    if (s[0], int(s[1])) != w:
        bad = overflows(p, plan["steps"]).get(k) is not None
        raise Mistake(f"{where}: the scale state is off: " + schedule_mistake(
            k, before, bad, (s[0], int(s[1])), w,
            (2.0, 0.5, plan["growth_interval"]), False))

