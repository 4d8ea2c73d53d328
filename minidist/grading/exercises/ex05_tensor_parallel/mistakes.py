"""Exercise 05's feedback: how a tensor, a number or a list of collective calls reads in a
sentence, and what a wrong output or gradient is in terms of the mistake that gives it (an
all-reduce missing or on the wrong side, an average for a sum, the bias added on every rank,
GELU after the sum, a shard cut along the wrong dimension). The closeness test is
``engine.compare.close`` at float64 rounding: the learner's layer must equal the full one."""

from __future__ import annotations

import torch

from ...engine.compare import close
from ...engine.data import contributors, pattern
from ...engine.diagnose import diagnose
from ...engine.feedback import values
from .ranks import OPERATOR_SHAPE


def describe(g) -> str:
    """A returned value in a sentence: shape and first values of a tensor, else its repr."""
    if isinstance(g, torch.Tensor):
        return f"{tuple(g.shape)} {values(g, 4)}"
    return repr(g)[:80]


def grad_text(grad) -> str:
    """A gradient's values, or None (autograd gave it none)."""
    return values(grad) if isinstance(grad, torch.Tensor) else "None"


def number(t) -> str:
    """A one-element tensor as a number, else its values."""
    if isinstance(t, torch.Tensor) and t.numel() == 1:
        return f"{t.item():.6g}"
    return grad_text(t)


def collective_names(calls: list) -> str:
    """``md.all_reduce of 48 elements, ...`` for calls recorded by ``ranks.Calls``."""
    return ", ".join(f"md.{c['name']} of {c['numel']} elements" for c in calls) or "none"


# -- f and g ------------------------------------------------------------------------------------
def f_output_hint(y, x, p: int) -> str:
    return diagnose([(p * x, "it is world_size times x: the forward all-reduced. f is the "
                             "identity forward (every rank already holds the same x); the "
                             "all-reduce belongs in its backward. All-reduce forward, "
                             "identity backward is g")], y) or \
        "f's forward returns x unchanged"


def wrong_op(calls: list, phase: str) -> str | None:
    """The op of the first all-reduce in ``phase`` that is not a sum, if any."""
    return next((c["op"] for c in calls if c["phase"] == phase and c["name"] == "all_reduce"
                 and c["op"] not in ("sum", "avg")), None)


def f_grad_hint(grad, rank: int, p: int, calls: list = ()) -> str:
    if not isinstance(grad, torch.Tensor):
        return ("no gradient reached x: return the gradient for x (and None for comm) from "
                "backward")
    op = wrong_op(calls, "backward")
    if op is not None:
        return (f"backward all-reduced with op={op!r}: op=\"{op}\" keeps one rank's value "
                "per element instead of combining them. x's gradient is the SUM of every "
                "rank's part (op=\"sum\")")
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


def g_output_hint(y, own, want, p: int) -> str:
    if close(y, own):
        return ("it is this rank's own partial sum: g's forward must all-reduce (sum) the "
                "partial results of every rank (all-reduce forward, identity backward: the "
                "mirror image of f)")
    if close(y * p, want):
        return "it is world_size times too small: sum the partial results, do not average"
    return "g's forward returns the sum over ranks of its input"


def g_grad_hint(grad, upstream, p: int) -> str:
    if close(grad, p * upstream):
        return ("it is world_size times too large: backward all-reduced the gradient. What "
                "follows g is the same on every rank, so the gradient arriving at g is "
                "already the full one, the same on every rank: pass it through unchanged")
    if not isinstance(grad, torch.Tensor):
        return "no gradient reached the input: return it from backward (and None for comm)"
    if p > 1 and close(grad * p, upstream):
        return ("it is world_size times too small: backward divided the gradient by "
                "world_size. Each rank's partial result enters the sum once, so its "
                "gradient is the incoming one, whole: g's backward is the identity")
    return "g's backward is the identity: return the incoming gradient"


# -- the parallel MLP ---------------------------------------------------------------------------
def mlp_output_hint(y, want: dict, rank: int, p: int) -> str:
    full, b2, partial = want["y"], want["b2"], want["partial"]
    own = ("it is this rank's partial result: c_proj is row-parallel, each rank's output is "
           "one term of a sum; all-reduce it with g before adding the bias")
    small = "it is world_size times too small: g sums the partial results, not averages"
    known = [  # (what the mistake outputs, hint)
        (full + (p - 1) * b2, "c_proj's bias was added on every rank before the all-reduce, "
                              f"so the sum holds it {p} times: add it once, to the all-reduced "
                              "output"),
        (partial[rank] + b2, own), (partial[rank], own),
        (want["gelu_late"], "GELU came after c_proj, after the sum: it belongs between the two "
                            "linears, on this rank's slice of the hidden layer. GELU is not "
                            "linear, so GELU(a + b) is not GELU(a) + GELU(b), and it must come "
                            "before the sum"),
        (full / p, small), ((full - b2) / p + b2, small),
    ]
    return diagnose(known, y) or (
        "order: f(x), c_fc on this rank's shard, GELU on this rank's slice of the hidden "
        "layer (GELU is not linear: it must come before the sum), c_proj's shard without its "
        "bias, g, then the bias")


def x_grad_hint(g, w, alone, p: int, calls: list = ()) -> str:
    if not isinstance(g, torch.Tensor):
        return "x got no gradient: was it detached, or did f's backward return None for it?"
    if close(g, alone):
        return ("the gradients of the replicated input were not summed: each rank's gradient "
                "of x covers only its slice of the hidden layer. Pass x through f "
                "(CopyToParallel) first, so that backward all-reduces its gradient")
    if p > 1 and close(g * p, w):
        return ("it is world_size times too small: f's backward must sum the ranks' parts "
                "of x's gradient, not average them")
    if close(g, w * p):
        return ("it is world_size times too large: the input's gradient was summed twice "
                "(f twice, or an all-reduce in g's backward)")
    op = wrong_op(calls, "backward")
    if op is not None:
        return (f"backward all-reduced with op={op!r}: x's gradient is the SUM over ranks "
                "of each rank's part (f's backward, op=\"sum\")")
    return "x's gradient is the sum over ranks of each rank's part: f's backward"


def weight_hint(g, w, name: str, p: int) -> str:
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
    if p > 1 and close(g * p, w):
        return ("it is world_size times too small: the gradient was divided by world_size "
                "on its way back (in g's backward?); g's backward is the identity")
    return ("it differs from the full MLP's gradient (this rank's block of it): each "
            "shard's gradient comes from this rank's own computation, with no all-reduce")


# -- the shards -----------------------------------------------------------------------------------
def piece_hint(k: int, g, full: torch.Tensor, r: int, p: int) -> str:
    dim = 0 if k < 2 else 1  # the dimension this piece is split along
    if k == 3:
        if close(g, full / p) or close(g, full.chunk(p)[r]):
            return ("c_proj's bias is not split: its output is the sum of every rank's "
                    "partial result, and the bias is added once, to the sum, so every rank "
                    "keeps the whole bias")
        return "c_proj's bias is the whole bias, on every rank"
    if k == 1 and close(g, full):
        return ("c_fc's bias belongs to its output features: each rank adds the bias of "
                "the features it computes, so split it like the weight's rows")
    if isinstance(g, torch.Tensor) and g.dim() == 2 and close(g, full.chunk(p, 1 - dim)[r]):
        return _wrong_dimension(k)
    if isinstance(g, torch.Tensor) and g.dim() == 2 and close(g.t(), full.chunk(p, dim)[r]):
        return ("that is the right block, transposed: keep nn.Linear's (out_features, "
                "in_features) layout, so that F.linear(x, weight, bias) uses it as is")
    if p > 1 and close(g, full[r::p] if dim == 0 else full[:, r::p]):
        return ("rank r takes every p-th row or column; take block r instead "
                "(tensor.chunk(world_size, dim)[rank]), as Megatron does, so that the "
                "shards line up with the other layer's")
    if close(g, full):
        return "that is the whole tensor: each rank keeps only its 1/world_size block"
    return "rank r keeps block r of world_size equal blocks (tensor.chunk(world_size, dim)[r])"


def _wrong_dimension(k: int) -> str:
    if k < 2:
        return ("split along the wrong dimension: a column-parallel linear splits its OUTPUT "
                "features (the columns of A in Y = X A), and nn.Linear stores A transposed, "
                "as weight of shape (out_features, in_features): split weight's rows, dim 0")
    return ("split along the wrong dimension: a row-parallel linear splits its INPUT "
            "features (the rows of A in Y = X A, to match the column-parallel layer's "
            "output slices), which are weight's columns in nn.Linear's (out_features, "
            "in_features) layout: split dim 1")


# -- the cross-entropy ----------------------------------------------------------------------------
def ce_grad_hint(grad, want, p: int) -> str:
    if not isinstance(grad, torch.Tensor):
        return ("no gradient reached the logits: md.all_reduce is not differentiable; sum "
                "through your ReduceFromParallel (g), whose backward is the identity, or "
                "write the backward yourself")
    if p > 1 and close(grad, want * p):
        return ("it is world_size times too large: the gradient was summed over ranks on "
                "its way back (an all-reduce in g's backward?)")
    if p > 1 and close(grad * p, want):
        return ("it is world_size times too small: the gradient was divided by world_size "
                "on its way back (in g's backward?); g's backward is the identity")
    return ("the gradient is (softmax(logits) - one_hot(target)) / positions: is the "
            "one-hot on the rank that holds the target word, and is the maximum (which only "
            "keeps exp in range) taken from logits.detach()?")
