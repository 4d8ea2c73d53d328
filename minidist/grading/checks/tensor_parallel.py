"""Tests of exercise 05: Megatron-LM's tensor parallelism by hand (Shoeybi et al. 2019,
section 3). The learner shards an MLP's two linears (column- then row-parallel), writes the
conjugate operators f (identity forward, all-reduce backward) and g (all-reduce forward,
identity backward) as autograd functions, and puts them together into the parallel MLP;
the stretch is the vocabulary-parallel cross-entropy.

The reference is one process holding the whole layer, in float64: every rank's output and
gradients must be the full layer's (its slice, for a sharded weight), on 1, 2 and 4 ranks.
Every collective the learner's code calls is recorded with its size and whether forward or
backward made it (``tp_probe.Calls``), so the feedback can say which all-reduce is missing,
extra, or on the wrong side. minidist's own tensor-parallel package and torch's process
groups are out of reach (``sandbox.TENSOR_PARALLEL``); ``md.all_reduce`` stays."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.data import contributors, pattern
from ..engine.feedback import Mistake, values
from ..engine.sandbox import TENSOR_PARALLEL
from ..engine.spec import GradedTest
from .tp_feedback import close, collective_names, describe, grad_text
from .tp_loss import check_vocab_parallel_cross_entropy
from .tp_probe import (
    OPERATOR_SHAPE,
    full_mlp,
    mlp_case,
    mlp_data,
    mlp_weights,
    operator_case,
    shard_of,
)
from .tp_shards import check_shard_mlp

RULES = (TENSOR_PARALLEL,)
OPERATOR_WORLDS, MLP_WORLDS = (2, 4), (1, 2, 4)
F_NAME, G_NAME = "CopyToParallel", "ReduceFromParallel"


# -- parts 2 and 3: f and g -------------------------------------------------------------------
def _run_operator(learner, name: str) -> None:
    for p in OPERATOR_WORLDS:
        label = f"world_size={p}"
        ranks = learner.run_ranks(operator_case, p, [(name,)], name, [label])
        for rank in range(p):
            got, where = ranks[rank][0]["value"], f"with {label}: rank {rank}"
            if "returned" in got:
                raise Mistake(f"{where}: {name}.apply(x, comm) returned "
                              f"{describe(got['returned'])}; forward returns one tensor of "
                              f"x's shape {OPERATOR_SHAPE}")
            if name == F_NAME:
                _check_f(got, rank, p, where)
            else:
                _check_g(got, rank, p, where)


def _check_f(got: dict, rank: int, p: int, where: str) -> None:
    x = pattern(0, OPERATOR_SHAPE, torch.float64, 1)
    if not close(got["y"], x):
        hint = ("it is world_size times x: the forward all-reduced. f is the identity "
                "forward (every rank already holds the same x); the all-reduce belongs in "
                "its backward. All-reduce forward, identity backward is g"
                if close(got["y"], p * x) else "f's forward returns x unchanged")
        raise Mistake(f"{where}: f's output is {values(got['y'])}, expected x = "
                      f"{values(x)}; {hint}")
    grad = got["grad"]
    want = sum(pattern(r, OPERATOR_SHAPE, torch.float64, p) for r in range(p))
    if not close(grad, want):
        raise Mistake(f"{where}: the gradient of x is {grad_text(grad)}, expected the sum of "
                      f"every rank's gradient {values(want)}; {_f_hint(grad, rank, p)}")
    _check_phases(got["calls"], {"forward": 0, "backward": 1}, "f", where)


def _f_hint(grad, rank: int, p: int) -> str:
    if not isinstance(grad, torch.Tensor):
        return ("no gradient reached x: return the gradient for x (and None for comm) from "
                "backward")
    own = pattern(rank, OPERATOR_SHAPE, torch.float64, p)
    if close(grad, own):
        return ("it is only this rank's own gradient, missing the all-reduce in backward. "
                "Every rank used the same x for its slice of the next layer, so x's true "
                "gradient is the sum over ranks; without the sum it is about 1/world_size of "
                "the truth on each rank")
    if close(grad * p, sum(pattern(r, OPERATOR_SHAPE, torch.float64, p) for r in range(p))):
        return ("it is world_size times too small: the gradients must be summed "
                "(op=\"sum\"), not averaged: each rank's part is a different piece of it")
    ranks = contributors(grad.flatten()[0].item(), 0, p)
    if ranks is not None:
        return f"it holds the gradients of ranks {ranks} only: all-reduce over every rank"
    return "backward all-reduces the incoming gradient (sum) and returns it for x"


def _check_g(got: dict, rank: int, p: int, where: str) -> None:
    want = sum(pattern(r, OPERATOR_SHAPE, torch.float64, p) for r in range(p))
    y, own = got["y"], pattern(rank, OPERATOR_SHAPE, torch.float64, p)
    if not close(y, want):
        if close(y, own):
            hint = ("it is this rank's own partial sum: g's forward must all-reduce (sum) "
                    "the partial results of every rank (all-reduce forward, identity "
                    "backward: the mirror image of f)")
        elif close(y * p, want):
            hint = "it is world_size times too small: sum the partial results, do not average"
        else:
            hint = "g's forward returns the sum over ranks of its input"
        raise Mistake(f"{where}: g's output is {values(y)}, expected the sum of every rank's "
                      f"input {values(want)}; {hint}")
    upstream = pattern(0, OPERATOR_SHAPE, torch.float64, 1) + 1
    grad = got["grad"]
    if not close(grad, upstream):
        if close(grad, p * upstream):
            hint = ("it is world_size times too large: backward all-reduced the gradient. What "
                    "follows g is the same on every rank, so the gradient arriving at g is "
                    "already the full one, the same on every rank: pass it through unchanged")
        elif not isinstance(grad, torch.Tensor):
            hint = "no gradient reached the input: return it from backward (and None for comm)"
        else:
            hint = "g's backward is the identity: return the incoming gradient"
        raise Mistake(f"{where}: the gradient of g's input is {grad_text(grad)}, expected "
                      f"the incoming gradient unchanged, {values(upstream)}; {hint}")
    _check_phases(got["calls"], {"forward": 1, "backward": 0}, "g", where)


def _check_phases(calls: list, want: dict, who: str, where: str) -> None:
    """Right values; the all-reduces on the side they belong (a check of communication:
    e.g. an all-reduce of zeros added by mistake)."""
    for phase, n in want.items():
        made = [c for c in calls if c["phase"] == phase]
        if len(made) != n:
            raise Mistake(f"{where}: {who}'s {phase} called {len(made)} collective(s) "
                          f"({collective_names(made)}); it needs {n}: "
                          + ("f all-reduces only in backward" if who == "f"
                             else "g all-reduces only in forward"))


def check_copy_to_parallel(learner) -> str:
    _run_operator(learner, F_NAME)
    return ("f: the identity forward, the sum of every rank's gradient backward, one "
            "all-reduce, in backward only, world sizes 2 and 4")


def check_reduce_from_parallel(learner) -> str:
    _run_operator(learner, G_NAME)
    return ("g: the sum of every rank's partial result forward, the gradient unchanged "
            "backward, one all-reduce, in forward only, world sizes 2 and 4")


# -- part 4: the parallel MLP ----------------------------------------------------------------
def _mlp_oracle(p: int) -> dict:
    """The full MLP's output and gradients, and what each rank would see alone."""
    w = [t.clone().requires_grad_() for t in mlp_weights()]
    x, dy = mlp_data()
    x = x.clone().requires_grad_()
    y = full_mlp(x, *w)
    (y * dy).sum().backward()
    pieces = [shard_of(*w, r, p) for r in range(p)]
    grads = [shard_of(*[t.grad for t in w], r, p) for r in range(p)]
    partial, alone = [], []  # each rank's term of the sum, and x's gradient through it
    for piece in pieces:
        xr = x.detach().clone().requires_grad_()
        term = F.linear(F.gelu(F.linear(xr, piece[0].detach(), piece[1].detach())),
                        piece[2].detach())
        (term * dy).sum().backward()
        partial.append(term.detach())
        alone.append(xr.grad)
    late = F.gelu(F.linear(F.linear(x, w[0], w[1]), w[2])) + w[3]  # GELU after the sum
    return {"y": y.detach(), "x_grad": x.grad, "grads": grads, "partial": partial,
            "alone": alone, "b2": w[3].detach(), "gelu_late": late.detach()}


def check_parallel_mlp(learner) -> str:
    for p in MLP_WORLDS:
        label = f"world_size={p}"
        ranks = learner.run_ranks(mlp_case, p, [()], "parallel_mlp", [label])
        want = _mlp_oracle(p)
        for rank in range(p):
            got, where = ranks[rank][0]["value"], f"with {label}: rank {rank}"
            if "returned" in got:
                raise Mistake(f"{where}: parallel_mlp returned {describe(got['returned'])}; "
                              f"expected the MLP's output, a tensor of x's shape "
                              f"{tuple(want['y'].shape)}")
            _check_mlp_output(got["y"], want, rank, p, where)
            _check_mlp_grads(got, want, rank, p, where)
            if p > 1:
                _check_mlp_calls(got["calls"], want["y"].numel(), where)
    return ("the full MLP's output and every gradient (input, both weights and biases) on "
            "every rank, one all-reduce of b*s*h elements forward and one backward, world "
            "sizes 1, 2 and 4")


def _check_mlp_output(y, want: dict, rank: int, p: int, where: str) -> None:
    if close(y, want["y"]):
        return
    full, b2, partial = want["y"], want["b2"], want["partial"]
    err = (y - full).abs().max().item() if isinstance(y, torch.Tensor) else float("nan")
    head = f"{where}: the output differs from the full MLP's by up to {err:.3g}"
    if close(y, full + (p - 1) * b2):
        hint = ("c_proj's bias was added on every rank before the all-reduce, so the sum "
                f"holds it {p} times: add it once, to the all-reduced output")
    elif close(y, partial[rank] + b2) or close(y, partial[rank]):
        hint = ("it is this rank's partial result: c_proj is row-parallel, each rank's "
                "output is one term of a sum; all-reduce it with g before adding the bias")
    elif close(y, want["gelu_late"]):
        hint = ("GELU came after c_proj, after the sum: it belongs between the two linears, "
                "on this rank's slice of the hidden layer. GELU is not linear, so "
                "GELU(a + b) is not GELU(a) + GELU(b), and it must come before the sum")
    elif close(y, full / p) or close(y, (full - b2) / p + b2):
        hint = "it is world_size times too small: g sums the partial results, not averages"
    else:
        hint = ("order: f(x), c_fc on this rank's shard, GELU on this rank's slice of the "
                "hidden layer (GELU is not linear: it must come before the sum), c_proj's "
                "shard without its bias, g, then the bias")
    raise Mistake(f"{head}; {hint}")


def _check_mlp_grads(got: dict, want: dict, rank: int, p: int, where: str) -> None:
    names = ("c_fc's weight shard", "c_fc's bias shard", "c_proj's weight shard",
             "c_proj's bias")
    for g, w, name in zip(got["grads"], want["grads"][rank], names):
        if not close(g, w):
            raise Mistake(f"{where}: the gradient of {name} is {grad_text(g)}, expected "
                          f"{values(w)}; {_weight_hint(g, w, name, p)}")
    g, w = got["x_grad"], want["x_grad"]
    if close(g, w):
        return
    if not isinstance(g, torch.Tensor):
        hint = "x got no gradient: was it detached, or did f's backward return None for it?"
    elif close(g, want["alone"][rank]):
        hint = ("the gradients of the replicated input were not summed: each rank's gradient "
                "of x covers only its slice of the hidden layer. Pass x through f "
                "(CopyToParallel) first, so that backward all-reduces its gradient")
    elif p > 1 and close(g * p, w):
        hint = ("it is world_size times too small: f's backward must sum the ranks' parts "
                "of x's gradient, not average them")
    elif close(g, w * p):
        hint = ("it is world_size times too large: the input's gradient was summed twice "
                "(f twice, or an all-reduce in g's backward)")
    else:
        hint = "x's gradient is the sum over ranks of each rank's part: f's backward"
    raise Mistake(f"{where}: the gradient of x is {values(g)}, expected {values(w)}; {hint}")


def _weight_hint(g, w, name: str, p: int) -> str:
    if not isinstance(g, torch.Tensor):
        return ("it got no gradient: is the path from it to the output cut (by .detach(), "
                ".data, or an md.all_reduce outside an autograd.Function, which autograd "
                "does not see)?")
    if name == "c_proj's bias" and close(g * p, w):
        return ("it is world_size times too small: you added c_proj's bias / world_size on "
                "every rank. The sum comes out right, but the bias is replicated, so each "
                "rank must see its whole gradient: add the whole bias once, after g")
    if close(g, w * p):
        return ("it is world_size times too large: the gradient was summed over ranks "
                "(an all-reduce in g's backward?)")
    return ("it differs from the full MLP's gradient (this rank's block of it): each "
            "shard's gradient comes from this rank's own computation, with no all-reduce")


def _check_mlp_calls(calls: list, numel: int, where: str) -> None:
    forward = [c for c in calls if c["phase"] == "forward"]
    backward = [c for c in calls if c["phase"] == "backward"]
    ok = lambda cs: len(cs) == 1 and cs[0]["name"] == "all_reduce" and cs[0]["numel"] == numel  # noqa: E731
    if not (ok(forward) and ok(backward)):
        raise Mistake(f"{where}: the values are right, but forward called "
                      f"{collective_names(forward)} and backward "
                      f"{collective_names(backward)}; a column-then-row MLP needs exactly "
                      f"one all-reduce of b*s*h = {numel} elements each way: g's in forward, "
                      "f's in backward (Megatron's 2 per MLP per step)")


TESTS = [  # in notebook order
    GradedTest("test_shard_mlp", 2, ("shard_mlp",), check_shard_mlp, RULES),
    GradedTest("test_copy_to_parallel", 2, (F_NAME,), check_copy_to_parallel, RULES),
    GradedTest("test_reduce_from_parallel", 2, (G_NAME,), check_reduce_from_parallel, RULES),
    GradedTest("test_parallel_mlp", 4, ("parallel_mlp",), check_parallel_mlp, RULES),
    GradedTest("test_vocab_parallel_cross_entropy", 3, ("vocab_parallel_cross_entropy",),
               check_vocab_parallel_cross_entropy, RULES, part="stretch"),
]
