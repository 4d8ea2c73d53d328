"""Exercise 04's stage tests: ``forward_step`` (receive the activation from rank - 1, run the
stage's module, send the output to rank + 1), ``backward_step`` (receive the output's
gradient from rank + 1, run backward, send the input's gradient to rank - 1) and the stretch
part, ``pipeline_step`` (a whole step of one stage from an action list: micro-batches, the
loss's scale, waiting for the sends).

Each runs in pipelines of 2, 3 and 4 ranks on 1F1B's and GPipe's action lists, with 1 to 4
micro-batches (fewer than the stages too); the first two are paired with the test's own
other half, whose sends block (``ranks.py``). The reference is one process running the
whole model on the whole batch in float64: every stage's input and output, the gradient it
sends back and its parameters' gradients. Every message the learner's steps send or receive
goes through ``ranks.StageComm``, which names a message to or from the wrong neighbour when
it happens. ``md.pipeline``'s schedules and runtime are out of reach.
"""

from __future__ import annotations

import torch

from ...engine.compare import compare
from ...engine.feedback import Mistake
from .mistakes import SEND_HINT, scale_hint
from .ranks import SCHEDULES, batch, loss_fn, stage_case, stage_module

WORLD_SIZES = (2, 3, 4)
BATCH, UNEVEN = 6, 10  # samples per batch: even micro-batches; 3, 3, 2, 2 for m = 4
CASES = {  # part -> (schedule, microbatches, batch)
    "forward": [("1f1b", 3, BATCH), ("gpipe", 2, BATCH), ("1f1b", 1, BATCH)],
    "backward": [("1f1b", 3, BATCH), ("gpipe", 2, BATCH), ("1f1b", 1, BATCH)],
    "step": [("1f1b", 4, UNEVEN), ("gpipe", 3, UNEVEN), ("1f1b", 2, BATCH)],
}
NAMES = {"forward": "forward_step", "backward": "backward_step", "step": "pipeline_step"}


def oracle(p: int, n: int, m: int, weights: list[float] | None = None) -> list[dict]:
    """One process, the whole model on the whole batch: per stage, its input, output, the
    gradients of both, and its parameters' gradients. ``weights``: micro-batch i's loss
    counts weights[i] (default: its share of the batch, the batch's mean loss)."""
    modules, (x, y) = [stage_module(r, p) for r in range(p)], batch(n)
    xs, ys = x.tensor_split(m), y.tensor_split(m)
    weights = weights or [len(b) / n for b in xs]
    h, seen = x, []
    for r, module in enumerate(modules):
        if r > 0:
            h.retain_grad()
        out = module(h)
        out.retain_grad()
        seen.append((h, out))
        h = out
    loss = sum(w * loss_fn(o, t) for w, o, t in zip(weights, h.tensor_split(m), ys))
    loss.backward()
    return [{"inputs": inp.detach(), "outs": out.detach(), "in_grads": inp.grad,
             "out_grads": out.grad, "grads": {name: q.grad for name, q in
                                              module.named_parameters()},
             "loss": float(loss.detach())}
            for (inp, out), module in zip(seen, modules)]


def _label(p: int, part: str, schedule: str, m: int, n: int) -> str:
    return f"stages={p}, {schedule} schedule, microbatches={m}, batch of {n}"


def _send_hint(text: str, *_) -> str:
    return text + SEND_HINT if "waits in send to" in text else text


def _run(learner, part: str):
    """Every case's (world size, schedule, micro-batches, batch, label, every stage's
    result), one world size after the other."""
    worlds = {p: [(part, *c) for c in CASES[part]] for p in WORLD_SIZES}
    for p, (_, s, m, n), label, results in learner.each_world(
            stage_case, NAMES[part], worlds, _label, _send_hint):
        yield p, s, m, n, label, [r["value"] for r in results]


def _tensor(got, want, who: str) -> None:
    problem = compare(got, want, who)
    if problem:
        raise Mistake(problem)


def _check_forward(stages: list[dict], want: list[dict], m: int, label: str) -> None:
    for r, (got, ref) in enumerate(zip(stages, want)):
        for i in range(m):
            where = f"with {label}: stage {r}, micro-batch {i}"
            wrong = compare(got["inputs"][i], ref["inputs"].tensor_split(m)[i], "it")
            if r > 0 and wrong:
                raise Mistake(f"{where}: the input forward_step returned is not the activation "
                              f"stage {r - 1} computed ({wrong}). Receive it from rank {r - 1} "
                              "into x (comm.recv waits until it has arrived) before the module "
                              "runs")
            wrong = compare(got["outs"][i], ref["outs"].tensor_split(m)[i],
                            f"{where}: the output")
            if wrong:
                raise Mistake(f"{wrong}. It is not the stage's module applied to its input"
                              + (": did the module run before the activation had arrived (an "
                                 "irecv not yet waited for)?" if r > 0 else ""))


def _check_backward(stages, want, m, label) -> None:
    for r in reversed(range(1, len(stages))):  # the order the gradients travel in
        for i in range(m):
            got, ref = stages[r]["in_grads"][i], want[r]["in_grads"].tensor_split(m)[i]
            where = f"with {label}: stage {r}, micro-batch {i}"
            if got is None:
                raise Mistake(f"{where}: backward_step sent no gradient back to stage {r - 1}")
            if compare(got, ref, "x") is None:
                continue
            if compare(got, want[r]["out_grads"].tensor_split(m)[i], "x") is None:
                raise Mistake(f"{where}: the gradient sent back is the gradient of the stage's "
                              "output, as received: send the gradient of its input, inp.grad, "
                              "which backward computes from it")
            _tensor(got, ref, f"{where}: the gradient of the stage's input")


def _check_grads(stages, want, label, step: str) -> None:
    for r in reversed(range(len(stages))):
        for name, ref in want[r]["grads"].items():
            got = stages[r]["grads"].get(name)
            where = f"with {label}: stage {r}, parameter {name}"
            if not isinstance(got, torch.Tensor):
                raise Mistake(f"{where} has no gradient after the step ({step})")
            _tensor(got, ref, f"{where}: the gradient accumulated over the micro-batches")


def check_forward_step(learner) -> str:
    for p, _, m, n, label, stages in _run(learner, "forward"):
        want = oracle(p, n, m)
        _check_forward(stages, want, m, label)
        _check_grads(stages, want, label, "with the test's backward")
    return ("every stage's output and gradients those of one process on the whole batch, "
            "1F1B and GPipe, 2 to 4 stages, 1 to 3 micro-batches")


def check_backward_step(learner) -> str:
    for p, _, m, n, label, stages in _run(learner, "backward"):
        want = oracle(p, n, m)
        _check_backward(stages, want, m, label)
        _check_grads(stages, want, label, "with your backward_step")
    return ("the gradient every stage sends back and every parameter's gradient those of one "
            "process on the whole batch, 1F1B and GPipe, 2 to 4 stages, 1 to 3 micro-batches")


def check_pipeline_step(learner) -> str:
    for p, schedule, m, n, label, stages in _run(learner, "step"):
        want = oracle(p, n, m)
        for r, got in enumerate(stages):
            kinds = [k for k, _ in SCHEDULES[schedule](r, p, m)]
            if got["log"] != kinds:
                raise Mistake(f"with {label}: stage {r} ran {' '.join(got['log'])}, where the "
                              f"actions say {' '.join(kinds)}: run them in their order")
        _check_loss(stages[-1]["loss"], want[-1]["loss"], label, (p, n, m))
        try:
            _check_grads(stages, want, label, "pipeline_step")
        except Mistake as e:
            raise Mistake(f"{e}{scale_hint(stages, p, n, m, oracle)}") from None
    return ("one process's loss and gradients on every stage with 1F1B and GPipe, 2 to 4 "
            "stages, micro-batches of unequal size, every isend waited for")


def _check_loss(got, want: float, label: str, shape) -> None:
    try:
        value = float(got.item() if isinstance(got, torch.Tensor) else got)
    except (TypeError, ValueError, RuntimeError):
        raise Mistake(f"with {label}: on the last stage pipeline_step returned {got!r:.60}, "
                      "expected the batch's loss (a number)") from None
    if abs(value - want) > 1e-9 * max(1.0, abs(want)):
        raise Mistake(f"with {label}: the last stage returned the loss {value:.6g}, but the "
                      f"batch's loss is {want:.6g}{scale_hint(value, *shape, oracle)}")
