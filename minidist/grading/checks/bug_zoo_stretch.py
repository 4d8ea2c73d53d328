"""Tests of exercise 10's stretch part (``bug_zoo.py`` has the core): float16 training
without loss scaling, graded against float32 gradients of the same problem (Micikevicius et
al., "Mixed Precision Training", ICLR 2018), and a 1F1B step that deadlocks when there are
fewer micro-batches than stages, graded by running it on 2 and 4 stages (a deadlock is
caught on the ranks and named: who waits for what, after how many passes) and against one
process running the stages' layers in order (Narayanan et al., PipeDream, SOSP 2019).
``md.GradScaler``, ``torch.amp.GradScaler`` (``AMP``) and ``md.pipeline``'s schedules and
runtime (``PIPELINE``; the simulator stays) are out of reach.
"""

from __future__ import annotations

import torch

from ..engine.feedback import Mistake, values
from ..engine.sandbox import AMP, PIPELINE
from ..engine.spec import GradedTest
from . import bug_zoo_probe as probe
from .mixed_precision import ranks_text


def close(a, b, tol: float = 1e-9) -> bool:
    """``a`` is a tensor of ``b``'s shape, equal to it within ``tol`` (relative and
    absolute)."""
    return isinstance(a, torch.Tensor) and a.shape == b.shape and \
        torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


# -- 6. float16 without loss scaling -----------------------------------------------------------
def check_fp16_step(learner) -> str:
    for p in (1, 2):
        got = learner.run_ranks(probe.fp16_case, p, [()], "fp16_step", [f"world_size={p}"])
        want = probe.fp16_oracle(p)
        start = [w.detach().float() for w in probe.fp16_model().parameters()]
        for k in range(probe.FP16["steps"]):
            for r in range(p):
                _judge_fp16(got[r][0]["value"][k], want[k], start, k, p, r)
    return ("the float32 master weights move as float32 gradients move them (within 2%) over "
            "2 steps, output gradients ~2^-26 (below float16's smallest subnormal), on 1 and 2 "
            "ranks")


def _judge_fp16(masters, want, start, k: int, p: int, r: int) -> None:
    where = f"with world_size={p}, after step {k}"
    for name, w, ref, w0 in zip(("weight", "bias"), masters, want, start):
        if not isinstance(w, torch.Tensor) or w.shape != ref.shape:
            raise Mistake(f"{where}: rank {r}'s master {name} is {values(w)}; update the "
                          "masters in place (optimizer.step())")
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
    for p, counts in PIPE_CASES.items():
        labels = [f"{m} micro-batch{'es' if m > 1 else ''} on {p} stages" for m in counts]
        got = learner.run_ranks(probe.pipeline_case, p, [(m,) for m in counts],
                                "pipeline_1f1b", labels)
        for i, (m, label) in enumerate(zip(counts, labels)):
            ranks = [got[r][i]["value"] for r in range(p)]
            _judge_deadlock(ranks, m, p)
            want = probe.pipeline_oracle(p, m)
            _judge_pipeline(ranks, want, m, p, label)
    return ("no deadlock and the loss and every stage's gradients of one process running the "
            "stages in order, for 1 to 6 micro-batches on 2 and 4 stages (fewer micro-batches "
            "than stages too)")


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


TESTS = [
    GradedTest("test_fp16_step", 3, ("fp16_step",), check_fp16_step, (AMP,), part="stretch"),
    GradedTest("test_pipeline_1f1b", 3, ("pipeline_1f1b",), check_pipeline_1f1b, (PIPELINE,),
               part="stretch"),
]
