"""What runs on each rank in exercise 04's stage tests (``pipeline_stages.py``): the stages'
modules, the data, the reference schedules, the test's own halves of a stage, one case on
one rank (:func:`stage_case`), and what puts ``md.pipeline``'s schedules and runtime out of
reach (the sandbox's ``PIPELINE`` rule). The learner's halves run through ``pipeline_watch.py``.

The test's own ``forward`` and ``backward`` send with ``comm.send``, which (at the grader's
eager limit of 0) returns only once the neighbour has received: a strict partner. Paired
with it, the learner's half alone must keep two neighbours from waiting in a send to each
other, as on a cluster where large messages are not buffered.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .pipeline_watch import StageMistake, their_backward, their_forward

D = 3  # features of every activation


def reference_1f1b(rank: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B on stage ``rank``: a warm-up of min(p - r - 1, m) forwards; then one forward and
    the oldest micro-batch's backward, until every forward has run; then the cool-down's
    backwards (PipeDream-Flush, Narayanan et al. 2021)."""
    warmup = min(stages - rank - 1, microbatches)
    out = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        out += [("F", i), ("B", i - warmup)]
    return out + [("B", i) for i in range(microbatches - warmup, microbatches)]


def reference_gpipe(rank: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """GPipe (Huang et al. 2019): every forward, then every backward."""
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


SCHEDULES = {"1f1b": reference_1f1b, "gpipe": reference_gpipe}


def stage_module(rank: int, stages: int) -> nn.Module:
    """Stage ``rank``'s part of the test model, the same in every process. With three stages
    or more, stage 1 has no parameters: it must still pass gradients on."""
    torch.manual_seed(10 + rank)
    if rank == 1 and stages >= 3:
        return nn.Tanh()
    return nn.Sequential(nn.Linear(D, D), nn.Tanh()).double()


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return (torch.randn(n, D, generator=g, dtype=torch.float64),
            torch.randn(n, D, generator=g, dtype=torch.float64))


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


# -- the test's own halves: blocking sends -----------------------------------------------------
def forward(comm, module, x, pending):
    r, p = comm.rank, comm.world_size
    if r > 0:
        comm.recv(x, r - 1)
        x.requires_grad_()
    out = module(x)
    if r < p - 1:
        comm.send(out.detach(), r + 1)
    return x, out


def backward(comm, inp, out, pending):
    r, p = comm.rank, comm.world_size
    if r < p - 1:
        grad = torch.empty_like(out)
        comm.recv(grad, r + 1)
        out.backward(grad)
    else:
        out.backward()
    if r > 0:
        if inp.grad is None:
            raise StageMistake(
                f"on stage {r}, the input forward_step returned has no gradient after "
                "backward: the module did not run on it. Mark the received tensor "
                ".requires_grad_() before the module runs, and return that same tensor as inp")
        comm.send(inp.grad, r - 1)


# -- one case on one rank ----------------------------------------------------------------------
def stage_case(comm, namespace, part: str, schedule: str, m: int, n: int) -> dict:
    """One rank runs ``schedule``'s actions on a batch of ``n`` in ``m`` micro-batches: the
    learner's ``forward_step`` with the test's backward (part "forward"), the test's forward
    with the learner's ``backward_step`` ("backward"), or the learner's ``pipeline_step``
    ("step"). Returns what the stage computed, for the parent to judge."""
    r, p = comm.rank, comm.world_size
    module, (x, y) = stage_module(r, p), batch(n)
    acts = SCHEDULES[schedule](r, p, m)
    if part == "step":
        return _step_case(comm, namespace["pipeline_step"], module, acts, m, (x, y))
    fwd = partial(their_forward, namespace["forward_step"]) if part == "forward" else forward
    bwd = partial(their_backward, namespace["backward_step"]) if part == "backward" \
        else backward
    xs, ys = x.tensor_split(m), y.tensor_split(m)
    pending, kept = [], {}
    rec = {"inputs": [None] * m, "outs": [None] * m, "in_grads": [None] * m}
    for kind, i in acts:
        if kind == "F":
            buf = xs[i].clone() if r == 0 else torch.empty(len(xs[i]), D, dtype=torch.float64)
            inp, out = fwd(comm, module, buf, pending)
            rec["inputs"][i], rec["outs"][i] = inp.detach().clone(), out.detach().clone()
            kept[i] = (inp, loss_fn(out, ys[i]) * len(xs[i]) / n if r == p - 1 else out)
        else:
            inp, out = kept.pop(i)
            sent = bwd(comm, inp, out, pending)
            rec["in_grads"][i] = sent if part == "backward" else None
    for req in pending:
        req.wait()
    return {**rec, "grads": _grads(module)}


def _grads(module) -> dict:
    return {name: None if q.grad is None else q.grad.clone()
            for name, q in module.named_parameters()}


class _Mark(torch.autograd.Function):
    """The identity; its backward notes "B" in the log."""

    @staticmethod
    def forward(ctx, x, log):
        ctx.log = log
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append("B")
        return grad, None


class Logged(nn.Module):
    """A stage's module that notes "F" for each forward and "B" for each backward."""

    def __init__(self, inner: nn.Module, log: list):
        super().__init__()
        self.inner, self.log = inner, log

    def forward(self, x):
        self.log.append("F")
        return _Mark.apply(self.inner(x), self.log)


def _step_case(comm, fn, module, acts, m, data) -> dict:
    r, p = comm.rank, comm.world_size
    x, y = data
    log: list[str] = []
    buf = x.clone() if r == 0 else torch.empty_like(x)
    loss = fn(comm, Logged(module, log), list(acts), m, buf, y.clone() if r == p - 1 else None,
              loss_fn)
    return {"loss": loss if r == p - 1 else None, "log": log, "grads": _grads(module)}
