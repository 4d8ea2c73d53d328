"""Exercise 05's tests: the pieces ``shard_mlp`` keeps (test weights whose every value says
where it sits, so the feedback can name the slice taken instead), Megatron's operators f
and g and the parallel MLP (every rank's output and gradients against the full layer in one
process, its slice for a sharded weight, and every collective the learner's code calls,
with its size and whether forward or backward made it: ``ranks.Calls``, so the feedback
can say which all-reduce is missing, extra, or on the wrong side), and the stretch's
vocabulary-parallel cross-entropy against ``F.cross_entropy`` on the whole logits (logits
near 800, where exp overflows without the maximum; no collective larger than one value per
position: the full logits must never travel)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...engine.compare import as_tensor, close
from ...engine.data import pattern
from ...engine.feedback import Mistake, values
from .mistakes import (
    ce_grad_hint,
    collective_names,
    describe,
    f_grad_hint,
    f_output_hint,
    g_grad_hint,
    g_output_hint,
    grad_text,
    mlp_output_hint,
    number,
    piece_hint,
    weight_hint,
    x_grad_hint,
)
from .ranks import (
    OPERATOR_SHAPE,
    ce_case,
    ce_data,
    full_mlp,
    mlp_case,
    mlp_data,
    mlp_weights,
    operator_case,
    shard_of,
)

OPERATOR_WORLDS, MLP_WORLDS = (2, 4), (1, 2, 4)
OPERATOR_NUMEL = math.prod(OPERATOR_SHAPE)
F_NAME, G_NAME = "CopyToParallel", "ReduceFromParallel"


def _label(p: int, *_) -> str:
    return f"world_size={p}"


# -- parts 2 and 3: f and g -------------------------------------------------------------------
def _run_operator(learner, name: str) -> None:
    worlds = {p: [(name,)] for p in OPERATOR_WORLDS}
    for p, _, label, results in learner.each_world(operator_case, name, worlds, _label):
        for rank, result in enumerate(results):
            got, where = result["value"], f"with {label}: rank {rank}"
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
        raise Mistake(f"{where}: f's output is {values(got['y'])}, expected x = "
                      f"{values(x)}; {f_output_hint(got['y'], x, p)}")
    grad = got["grad"]
    want = sum(pattern(r, OPERATOR_SHAPE, torch.float64, p) for r in range(p))
    if not close(grad, want):
        hint = f_grad_hint(grad, rank, p, got["calls"])
        raise Mistake(f"{where}: the gradient of x is {grad_text(grad)}, expected the sum of "
                      f"every rank's gradient {values(want)}; {hint}")
    _check_phases(got["calls"], {"forward": 0, "backward": 1}, "f", where)


def _check_g(got: dict, rank: int, p: int, where: str) -> None:
    want = sum(pattern(r, OPERATOR_SHAPE, torch.float64, p) for r in range(p))
    y, own = got["y"], pattern(rank, OPERATOR_SHAPE, torch.float64, p)
    if not close(y, want):
        raise Mistake(f"{where}: g's output is {values(y)}, expected the sum of every rank's "
                      f"input {values(want)}; {g_output_hint(y, own, want, p)}")
    upstream = pattern(0, OPERATOR_SHAPE, torch.float64, 1) + 1
    grad = got["grad"]
    if not close(grad, upstream):
        raise Mistake(f"{where}: the gradient of g's input is {grad_text(grad)}, expected "
                      f"the incoming gradient unchanged, {values(upstream)}; "
                      f"{g_grad_hint(grad, upstream, p)}")
    _check_phases(got["calls"], {"forward": 1, "backward": 0}, "g", where)


def _check_phases(calls: list, want: dict, who: str, where: str) -> None:
    """Right values; then exactly the communication the operator needs: one all-reduce
    (sum) of x's elements on its side, none on the other (so an all-reduce of zeros added
    by mistake, an all-gather and a local sum, or one all-reduce per row all fail)."""
    numel = OPERATOR_NUMEL
    for phase, n in want.items():
        made = [c for c in calls if c["phase"] == phase]
        right = len(made) == n and all(
            c["name"] == "all_reduce" and c["numel"] == numel and c["op"] == "sum" for c in made)
        if not right:
            side = "backward" if who == "f" else "forward"
            raise Mistake(f"{where}: the values are right, but {who}'s {phase} called "
                          f"{collective_names(made)}; {who} needs exactly one md.all_reduce "
                          f"(op=\"sum\") of x's {numel} elements ({8 * numel} bytes of "
                          f"float64) in {side}, and no collective in the other direction")


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
    worlds = {p: [()] for p in MLP_WORLDS}
    for p, _, label, results in learner.each_world(mlp_case, "parallel_mlp", worlds, _label):
        want = _mlp_oracle(p)
        for rank, result in enumerate(results):
            got, where = result["value"], f"with {label}: rank {rank}"
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
    err = (y - want["y"]).abs().max().item() if isinstance(y, torch.Tensor) else float("nan")
    raise Mistake(f"{where}: the output differs from the full MLP's by up to {err:.3g}; "
                  f"{mlp_output_hint(y, want, rank, p)}")


def _check_mlp_grads(got: dict, want: dict, rank: int, p: int, where: str) -> None:
    names = ("c_fc's weight shard", "c_fc's bias shard", "c_proj's weight shard",
             "c_proj's bias")
    for g, w, name in zip(got["grads"], want["grads"][rank], names):
        if not close(g, w):
            raise Mistake(f"{where}: the gradient of {name} is {grad_text(g)}, expected "
                          f"{values(w)}; {weight_hint(g, w, name, p)}")
    g, w = got["x_grad"], want["x_grad"]
    if not close(g, w):
        raise Mistake(f"{where}: the gradient of x is {values(g)}, expected {values(w)}; "
                      f"{x_grad_hint(g, w, want['alone'][rank], p, got['calls'])}")


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


# -- part 1: the shards ----------------------------------------------------------------------
SHARD_CASES = [(8, 4, 1), (8, 4, 2), (12, 5, 3), (16, 4, 4)]  # (hidden, h, world size)


def _shard_inputs(hidden: int, h: int) -> tuple[torch.Tensor, ...]:
    """Weights whose every value says where it sits (c_fc's 1000s, c_proj's 2000s)."""
    w1 = 1000 + torch.arange(hidden * h, dtype=torch.float64).reshape(hidden, h)
    w2 = 2000 + torch.arange(h * hidden, dtype=torch.float64).reshape(h, hidden)
    return w1, -1 - torch.arange(hidden, dtype=torch.float64), w2, \
        -100 - torch.arange(h, dtype=torch.float64)


def check_shard_mlp(learner) -> str:
    calls, labels = [], []
    for hidden, h, p in SHARD_CASES:
        case = f"c_fc = nn.Linear({h}, {hidden}), c_proj = nn.Linear({hidden}, {h}), " \
               f"world_size={p}"
        calls += [(*_shard_inputs(hidden, h), r, p) for r in range(p)]
        labels += [f"{case}, rank {r}" for r in range(p)]
    results = iter(learner.call_each("shard_mlp", calls, labels))
    for (hidden, h, p) in SHARD_CASES:
        full = _shard_inputs(hidden, h)
        for r in range(p):
            got = next(results)
            where = f"with c_fc = nn.Linear({h}, {hidden}), c_proj = nn.Linear({hidden}, " \
                    f"{h}), world_size={p}: rank {r}"
            _check_pieces(got, full, r, p, where)
    return ("c_fc split by output features (rows of its weight, and its bias), c_proj by "
            "input features (columns of its weight, whole bias), block r on rank r, in "
            f"{len(SHARD_CASES)} shapes")


def _check_pieces(got, full, r: int, p: int, where: str) -> None:
    if not (isinstance(got, (list, tuple)) and len(got) == 4):
        raise Mistake(f"{where}: shard_mlp returned {got!r:.100}; return the four pieces "
                      "(fc_weight, fc_bias, proj_weight, proj_bias) as a tuple")
    want = shard_of(*full, r, p)
    names = ("c_fc's weight", "c_fc's bias", "c_proj's weight", "c_proj's bias")
    for k, (g, w, name) in enumerate(zip(got, want, names)):
        g = as_tensor(g, w)  # a list of the right numbers is the same answer
        if not close(g, w):
            raise Mistake(f"{where}: {name} piece is {describe(g)}, expected the "
                          f"{tuple(w.shape)} block {values(w, 4)}; "
                          f"{piece_hint(k, g, full[k], r, p)}")


# -- part 5 (stretch): the vocabulary-parallel cross-entropy ---------------------------------
WORLD_SIZES = (1, 2, 4)


def check_vocab_parallel_cross_entropy(learner) -> str:
    logits, targets = ce_data()
    full = logits.clone().requires_grad_()
    loss = F.cross_entropy(full, targets)
    loss.backward()
    worlds = {p: [()] for p in WORLD_SIZES}
    for p, _, label, results in learner.each_world(ce_case, "vocab_parallel_cross_entropy",
                                                   worlds, lambda p: f"world_size={p}"):
        got_all = [r["value"] for r in results]
        for rank in range(p):
            got, where = got_all[rank], f"with {label}: rank {rank}"
            if "returned" in got:
                raise Mistake(f"{where}: vocab_parallel_cross_entropy returned "
                              f"{describe(got['returned'])}; expected the mean loss, a "
                              "tensor of shape () (the same on every rank)")
            _check_loss(got["loss"], loss.detach(), [g.get("loss") for g in got_all], where)
            want = full.grad.chunk(p, 1)[rank]
            if not close(got["grad"], want):
                raise Mistake(f"{where}: the gradient of this rank's logits is "
                              f"{grad_text(got['grad'])}, expected {values(want)} (softmax "
                              f"minus one-hot, over the number of positions, this rank's "
                              f"columns); {ce_grad_hint(got['grad'], want, p)}")
            big = [c for c in got["calls"] if c["numel"] > logits.shape[0]]
            if big and p > 1:
                raise Mistake(f"{where}: the loss is right, but you called "
                              f"{collective_names(big)}: whole slices of logits travelled. "
                              "Only per-position numbers "
                              f"need to ({logits.shape[0]} values each): the maximum, the sum "
                              "of exponentials and the target's logit")
            if p > 1:
                _check_ce_calls(got["calls"], logits.shape[0], where)
    return ("F.cross_entropy's loss and gradient from vocabulary slices, on 1, 2 and 4 ranks, "
            "with logits near 800; forward exactly one all-reduce (max) and the sums' 2 "
            "values per position, backward none")


def _check_ce_calls(calls: list, n: int, where: str) -> None:
    """Exactly Megatron's communication: the maximum (one all-reduce, op max, one value per
    position), then the sums of exponentials and the targets' logits (n values each, in two
    all-reduces or one of 2n), in forward; nothing in backward."""
    forward = [c for c in calls if c["phase"] == "forward"]
    tops = [c for c in forward if c["name"] == "all_reduce" and c["op"] == "max"]
    sums = [c for c in forward if c["name"] == "all_reduce" and c["op"] == "sum"]
    right = (len(tops) == 1 and tops[0]["numel"] == n and len(tops) + len(sums) == len(forward)
             and sum(c["numel"] for c in sums) == 2 * n and len(forward) == len(calls))
    if not right:
        backward = [c for c in calls if c["phase"] == "backward"]
        raise Mistake(f"{where}: the loss and gradient are right, but forward called "
                      f"{collective_names(forward)} and backward "
                      f"{collective_names(backward)}; the loss needs exactly one md.all_reduce "
                      f"(op=\"max\") of the {n} positions' maxima and sums of {2 * n} values "
                      f"(the sum of exponentials and the target's logit, {n} each: "
                      f"{8 * 3 * n} bytes in all), and backward none (g's is the identity)")


def _check_loss(got, want, every_rank: list, where: str) -> None:
    if close(got, want):
        return
    head = f"{where}: the loss is {number(got)}, expected {want.item():.6g}"
    if isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        raise Mistake(f"{head}; exp overflowed (one position's logits are near 800): take "
                      "the maximum over the whole vocabulary first (this rank's maximum, "
                      "then md.all_reduce with op=\"max\") and subtract it before exp")
    if any(not close(other, got) for other in every_rank):
        shown = ", ".join(number(other) for other in every_rank)
        raise Mistake(f"{head}; the loss differs between ranks ({shown}): each rank used "
                      "only its own slice of the vocabulary. The sum of exponentials and "
                      "the target's logit must be summed over ranks (g)")
    raise Mistake(f"{head}; the loss per position is log(sum over the whole vocabulary of "
                  "exp(logit)) - logit[target], where the target's logit lives on one rank "
                  f"(rank r holds words [r * V/p, (r+1) * V/p)); the mean over positions")
