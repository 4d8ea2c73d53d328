"""Tests of exercise 04's stage functions: ``forward_step`` (receive the activation from
rank - 1, run the stage's module, send the output to rank + 1), ``backward_step`` (receive
the output's gradient from rank + 1, run backward, send the input's gradient to rank - 1)
and the stretch part, ``pipeline_step`` (a whole step of one stage from an action list:
micro-batches, the loss's scale, waiting for the sends).

Each runs in pipelines of 2, 3 and 4 ranks on 1F1B's and GPipe's action lists, with 1 to 4
micro-batches (fewer than the stages too); the first two are paired with the test's own
other half, whose sends block (``pipeline_probe.py``). The reference is one process running
the whole model on the whole batch in float64: every stage's input and output, the gradient
it sends back and its parameters' gradients. Every message the learner's steps send or
receive goes through ``pipeline_probe.StageComm``, which names a message to or from the
wrong neighbour when it happens. ``md.pipeline``'s schedules and runtime are out of reach.
"""

from __future__ import annotations

import torch

from ..engine.compare import compare
from ..engine.feedback import Mistake
from ..engine.sandbox import PIPELINE
from ..engine.spec import GradedTest
from .pipeline_probe import batch, loss_fn, stage_case, stage_module

WORLD_SIZES = (2, 3, 4)
BATCH, UNEVEN = 6, 10  # samples per batch: even micro-batches; 3, 3, 2, 2 for m = 4
CASES = {  # part -> (schedule, microbatches, batch)
    "forward": [("1f1b", 3, BATCH), ("gpipe", 2, BATCH), ("1f1b", 1, BATCH)],
    "backward": [("1f1b", 3, BATCH), ("gpipe", 2, BATCH), ("1f1b", 1, BATCH)],
    "step": [("1f1b", 4, UNEVEN), ("gpipe", 3, UNEVEN), ("1f1b", 2, BATCH)],
}
NAMES = {"forward": "forward_step", "backward": "backward_step", "step": "pipeline_step"}
SEND_HINT = (
    "\nIn a pipeline, neighbours send to each other: stage r sends activations to r + 1 while "
    "r + 1 sends gradients to r. With comm.send (which returns only once the message is "
    "received) both can wait in their sends at once. Send with comm.isend, append the "
    "request to pending and return: the step waits for every request at its end.")


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
             "out_grads": out.grad, "grads": _grads(module), "loss": float(loss.detach())}
            for (inp, out), module in zip(seen, modules)]


def _grads(module) -> dict:
    return {name: q.grad for name, q in module.named_parameters()}


def _run(learner, part: str):
    """Every world size's results, with the oracle of each case."""
    for p in WORLD_SIZES:
        labels = [f"stages={p}, {s} schedule, microbatches={m}, batch of {n}"
                  for s, m, n in CASES[part]]
        try:
            ranks = learner.run_ranks(stage_case, p, [(part, *c) for c in CASES[part]],
                                      NAMES[part], labels)
        except Mistake as e:
            text = str(e)
            raise Mistake(text + SEND_HINT if "waits in send to" in text else text) from None
        for k, ((_, m, n), label) in enumerate(zip(CASES[part], labels)):
            yield p, m, n, label, [ranks[r][k]["value"] for r in range(p)]


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
    for p, m, n, label, stages in _run(learner, "forward"):
        want = oracle(p, n, m)
        _check_forward(stages, want, m, label)
        _check_grads(stages, want, label, "with the test's backward")
    return ("every stage's output and gradients those of one process on the whole batch, "
            "1F1B and GPipe, 2 to 4 stages, 1 to 3 micro-batches")


def check_backward_step(learner) -> str:
    for p, m, n, label, stages in _run(learner, "backward"):
        want = oracle(p, n, m)
        _check_backward(stages, want, m, label)
        _check_grads(stages, want, label, "with your backward_step")
    return ("the gradient every stage sends back and every parameter's gradient those of one "
            "process on the whole batch, 1F1B and GPipe, 2 to 4 stages, 1 to 3 micro-batches")


def check_pipeline_step(learner) -> str:
    for p, m, n, label, stages in _run(learner, "step"):
        want = oracle(p, n, m)
        for r, got in enumerate(stages):
            kinds = [k for k, _ in _actions(r, p, m, label)]
            if got["log"] != kinds:
                raise Mistake(f"with {label}: stage {r} ran {' '.join(got['log'])}, where the "
                              f"actions say {' '.join(kinds)}: run them in their order")
        _check_loss(stages[-1]["loss"], want[-1]["loss"], label, (p, n, m))
        try:
            _check_grads(stages, want, label, "pipeline_step")
        except Mistake as e:
            raise Mistake(f"{e}{_scale_hint(stages, p, n, m)}") from None
    return ("one process's loss and gradients on every stage with 1F1B and GPipe, 2 to 4 "
            "stages, micro-batches of unequal size")


def _actions(r, p, m, label):
    from .pipeline_probe import SCHEDULES

    return SCHEDULES["gpipe" if "gpipe" in label else "1f1b"](r, p, m)


def _check_loss(got, want: float, label: str, shape) -> None:
    try:
        value = float(got.item() if isinstance(got, torch.Tensor) else got)
    except (TypeError, ValueError, RuntimeError):
        raise Mistake(f"with {label}: on the last stage pipeline_step returned {got!r:.60}, "
                      "expected the batch's loss (a number)") from None
    if abs(value - want) > 1e-9 * max(1.0, abs(want)):
        raise Mistake(f"with {label}: the last stage returned the loss {value:.6g}, but the "
                      f"batch's loss is {want:.6g}{_scale_hint(value, *shape)}")


def _scale_hint(got, p: int, n: int, m: int) -> str:
    """A hint if ``got`` (the returned loss, or every stage's results) is that of another
    weighting of the micro-batches' losses."""
    sizes = [len(b) for b in torch.arange(n).tensor_split(m)]
    for weights, text in (([1.0] * m, "the sum of the micro-batches' losses"),
                          ([1.0 / m] * m, "each micro-batch's loss weighted 1/m")):
        want = oracle(p, n, m, weights)
        if _same(got, want):
            return (f". That is what {text} gives; each micro-batch's loss is a mean over "
                    f"its own samples (here {sizes} samples), so weight micro-batch i's loss "
                    "by its share of the batch, n_i / n, to get the batch's mean loss")
    return ""


def _same(got, want: list[dict]) -> bool:
    if isinstance(got, float):
        return abs(got - want[-1]["loss"]) <= 1e-9 * max(1.0, abs(got))
    return all(isinstance(got[r]["grads"].get(k), torch.Tensor) and
               torch.allclose(got[r]["grads"][k], g, rtol=1e-9, atol=1e-12)
               for r in range(len(want)) for k, g in want[r]["grads"].items())


TESTS = [
    GradedTest("test_forward_step", 3, ("forward_step",), check_forward_step,
               rules=(PIPELINE,)),
    GradedTest("test_backward_step", 3, ("backward_step",), check_backward_step,
               rules=(PIPELINE,)),
    GradedTest("test_pipeline_step", 3, ("pipeline_step",), check_pipeline_step,
               rules=(PIPELINE,), part="stretch"),
]
