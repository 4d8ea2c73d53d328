"""What exercise 09's feedback says: given a learner's wrong tensor and the grader's oracle,
name the mistake: which ranks a sum holds, which two ranks passed one colour to
``comm.split``, and the known mistakes of top-k and PowerSGD, declared as the oracle's
variant that replays each (a residual not carried, top-k by signed value, a sum for an
average, PowerSGD's P not orthonormalised or Q not averaged)."""

from __future__ import annotations

import torch

from ...engine.compare import Tolerance, isclose
from ...engine.compare import close as _close
from ...engine.data import contributors
from ...engine.diagnose import diagnose
from ...engine.feedback import ranks_text, values
from .ranks import local_of, node_of, powersgd_reference, topk_reference

TOLERANCE = Tolerance(1e-6, 1e-9)  # float64 oracles; the learner's float32 or float64 sums


def close(a, b) -> bool:
    return _close(a, b, TOLERANCE)


def differences(got, want) -> str:
    """Where two tensors of one shape differ: the first few positions, with both values."""
    wrong = (~isclose(got, want, TOLERANCE)).flatten()
    at = wrong.nonzero().flatten().tolist()
    shown = ", ".join(f"[{i}] = {float(got.flatten()[i]):.6g} (expected "
                      f"{float(want.flatten()[i]):.6g})" for i in at[:3])
    return f"{len(at)} of {got.numel()} values differ: {shown}" + (" ..." if len(at) > 3 else "")


def mismatch(got, want, what: str) -> str:
    """What is wrong with ``got`` (a learner's tensor) against ``want``, in one clause."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}"
    if got.shape != want.shape:
        return (f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)} (got "
                f"{values(got)})")
    return f"{what}: {differences(got, want)}"


def sum_hint(value: float, i: int, rank: int, per_node: int, world: int) -> str:
    node = [r for r in range(world) if node_of(r, per_node) == node_of(rank, per_node)]
    same = [r for r in range(world) if local_of(r, per_node) == local_of(rank, per_node)]
    ranks = contributors(value, i, world)
    if ranks == node and len(node) < world:
        return (f"that is the sum over its own node only ({ranks_text(node)}): the "
                "all_reduce across nodes is missing, or it did not reach this shard")
    if ranks == same and len(same) < world:
        return (f"that is the sum over the ranks with its local index only ("
                f"{ranks_text(same)}): the reduce-scatter (and all-gather) inside the node is "
                "missing, or covered another part of the tensor")
    if ranks == [rank]:
        return (f"that is rank {rank}'s own value: t was not changed (write the sum into "
                "it, in place)")
    for divisor in sorted({world, per_node, world // per_node} - {1}):
        whole = value * divisor
        if whole == round(whole) and contributors(whole, i, world) == list(range(world)):
            return (f"that is the sum divided by {divisor}: an average crept in (op='avg'); "
                    "all_reduce here means the sum, op='sum', at every step")
    for times in (per_node, world // per_node, world):
        if times > 1 and contributors(value / times, i, world) == list(range(world)):
            return (f"that is every rank's value counted {times} times: each piece must be "
                    "summed over the node once (reduce-scatter), over the nodes once "
                    "(all_reduce of the shard), then only copied (all-gather)")
    if ranks is not None:
        return (f"that is the sum over {ranks_text(ranks)}: a group must be a whole node "
                "(inside) or every rank with one local index (across)")
    return "each rank must end with the sum over every rank, each value counted once"


def split_hint(results: list[dict], per_node: int) -> str:
    """A sentence naming two ranks that passed the same colour to one ``comm.split`` call
    while they share neither a node nor a local index; '' if there are none."""
    calls = [res["value"]["splits"] for res in results]
    for j in range(min(len(c) for c in calls)):
        groups: dict = {}
        for rank, c in enumerate(calls):
            if c[j][0] is not None:
                groups.setdefault(c[j][0], []).append(rank)
        for color, members in groups.items():
            for a in members:
                b = next((b for b in members if node_of(b, per_node) != node_of(a, per_node)
                          and local_of(b, per_node) != local_of(a, per_node)), None)
                if b is not None:
                    return (f". In your comm.split call {j + 1}, rank {a} and rank {b} used "
                            f"the same colour {color}, but rank {a} is on node "
                            f"{node_of(a, per_node)} with local index {local_of(a, per_node)} "
                            f"and rank {b} on node {node_of(b, per_node)} with local index "
                            f"{local_of(b, per_node)}: the group inside a node takes colour "
                            "rank // per_node, the group across nodes colour rank % per_node")
    return ""


def avg_hint(avg, grads, res_in, at: tuple, runs, grads_of) -> str:
    k, step, rank = at
    world = len(grads)
    want, _, sent = topk_reference(grads, res_in, k)
    own = ("that is this rank's own sparse gradient only: exchange the k values and their "
           "indices with every rank (md.all_gather) and add them all up")
    def overwritten():  # each rank's entries written in turn, the last rank's kept
        out = torch.zeros_like(want)
        for s in sent:
            out[s != 0] = s[s != 0]
        return out / world

    known = [  # (the average the mistake gives; None where it cannot show, hint)
        (lambda: world * want if world > 1 else None,
         "the result is the sum of the ranks' sparse gradients, not their average: divide by "
         f"world_size ({world})"),
        (lambda: topk_reference(grads, res_in, k, signed=True)[0],
         "the indices are those of the largest values by signed value, not by magnitude: a "
         "large negative entry matters as much as a large positive one; choose them by "
         "corrected.abs()"),
        (lambda: topk_reference(grads, res_in, k, carry=False)[0] if step > 0 else None,
         lambda: "the residual was not carried to the next step: here the top k were taken "
                 "from the gradient alone, without the residual handed in (add it first: "
                 "corrected = grad + residual); what was held back at step "
                 f"{step - 1} is lost for good. " + drift_text(runs, step, grads_of)),
        (lambda: sum(g + r for g, r in zip(grads, res_in)) / world,
         "every entry was sent: keep only the k entries of largest magnitude on each rank and "
         "zero the rest (that is the compression)"),
        (lambda: sum(g * (s != 0) for g, s in zip(grads, sent)) / world if step > 0 else None,
         "the right indices, but the values sent are the gradient's: send the corrected "
         "values, grad + residual, at those indices"),
        (sent[rank], own), (lambda: sent[rank] / world, own),
        (lambda: overwritten() if world > 1 else None,
         "where several ranks chose the same index, only one rank's value arrived: the "
         "entries were written (out[idx] = values), so each overwrote the one before. Add "
         "them up: out.index_add_(0, idx, values)"),
    ]
    return diagnose(known, avg, tol=TOLERANCE) or (
        "each rank keeps the k entries of largest |grad + residual|; the result is the "
        "average of those sparse vectors over the ranks")


def drift_text(runs: list[list[dict]], step: int, grads_of) -> str:
    """After the learner's steps 0..step: max |everything transmitted + the residuals - the
    true gradients|, which error feedback keeps at 0 (nothing is lost, only delayed)."""
    world = len(runs)
    sent = sum(world * runs[0][s]["averaged"].double() for s in range(step + 1))
    residuals = sum(run[step]["residual"].double() for run in runs)
    true = sum(g for s in range(step + 1) for g in grads_of(s))
    drift = float((sent + residuals - true).abs().max())
    return (f"After {step + 1} steps the transmitted sum plus the residuals differs from the "
            f"true sum of the gradients by up to {drift:.3g} (with error feedback it stays 0: "
            "what is not sent now is sent later)")


def residual_hint(res, corrected, grad, sent, step: int) -> str:
    if isinstance(res, torch.Tensor) and res.shape == corrected.shape and \
            not bool(res.any()):
        return ("the new residual is all zeros: it must keep what this rank did not send, "
                "corrected - sent (grad + residual with the k sent entries zeroed), for the "
                "next step")
    known = [  # (the residual the mistake leaves; None where it cannot show, hint)
        (corrected, "the new residual still holds the k entries that were sent: zero them "
                    "there, or they are sent again at the next step"),
        (grad - sent if step > 0 else None,
         "the residual was not carried to the next step: the new residual dropped the "
         "residual handed in; new_residual = grad + residual - sent"),
        (sent, "the residual holds the sent entries and zeros elsewhere: the reverse; keep "
               "what was NOT sent"),
    ]
    return diagnose(known, res, tol=TOLERANCE) or (
        "new_residual = (grad + residual) - this rank's own sparse vector (not the average)")


POWER_MISTAKES = [  # (the variant of ``ranks.powersgd_reference`` that replays it, hint)
    ("no_orth", "P was not orthonormalised before Q = M^T P: without it P Q^T is not a "
                "projection of M (torch.linalg.qr(P).Q)"),
    ("orth_before_avg", "each rank orthonormalised its own P before averaging: all-reduce "
                        "(average) P first, then orthonormalise, so every rank holds the "
                        "same basis"),
    ("sum", "the sum, not the average: divide the all-reduced P and Q by world_size"),
    ("local_q", "Q = M^T P was not averaged over the ranks, so M_hat approximates this "
                "rank's M, not the average of every rank's"),
    ("local_p", "P = M Q was not averaged over the ranks before it was orthonormalised: each "
                "rank projected onto the basis of its own M, so the ranks' P differ and Q's "
                "average mixes them. All-reduce (average) P, then orthonormalise"),
    ("complete", "P was orthonormalised with a complete QR (m columns, a basis of the whole "
                 "space, so nothing is compressed and Q has m columns too): take the reduced "
                 "QR, torch.linalg.qr(P).Q, r columns"),
]


def power_hint(approx, Ms, Q, rank: int) -> str:
    want = powersgd_reference(Ms, Q, rank)[0]
    if isinstance(approx, torch.Tensor) and approx.shape == want.T.shape and \
            approx.shape != want.shape and close(approx.T, want):
        return (f"that is M_hat transposed: M_hat = P Q^T has M's shape {tuple(want.shape)} "
                "(P is m x r, Q is n x r), not Q P^T")
    return diagnose(POWER_MISTAKES, approx,
                    lambda variant: powersgd_reference(Ms, Q, rank, variant)[0],
                    tol=TOLERANCE) or \
        "P = M Q averaged over the ranks, orthonormalised; Q = M^T P averaged; M_hat = P Q^T"
