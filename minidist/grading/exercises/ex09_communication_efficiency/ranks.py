"""What runs on each rank in exercise 09's tests, and their oracles.

The oracles are the grader's own, in float64, independent of minidist's hierarchical
all_reduce and compression (out of reach while the tests run: the sandbox's
``COMM_EFFICIENCY`` rule):

- hierarchical all_reduce: the sum of every rank's ``engine.data.pattern`` (exact integers, whose
  low bits say which ranks contributed), and the bytes a ring moves across nodes;
- top-k with error feedback (Stich et al., "Sparsified SGD with Memory", NeurIPS 2018; Lin et
  al., "Deep Gradient Compression", ICLR 2018): every rank adds its residual, keeps its k
  entries of largest magnitude, and the ranks average the sparse vectors;
- PowerSGD's step (Vogels et al., NeurIPS 2019, Algorithm 1): P = M Q averaged,
  orthonormalised, Q = M^T P averaged, M ~ P Q^T.

On each rank, the case functions call the learner's function on the grader's data and
return what it left behind; ``hierarchy_case`` also records the colours of the rank's
``comm.split`` calls, so that feedback can name a wrong one.
"""

from __future__ import annotations

import torch

from ...engine.data import pattern

DTYPES = {"float64": torch.float64, "float32": torch.float32}


# -- hierarchical all_reduce -----------------------------------------------------------------
def node_of(rank: int, per_node: int) -> int:
    return rank // per_node


def local_of(rank: int, per_node: int) -> int:
    return rank % per_node


def hierarchy_case(comm, namespace, per_node: int, n: int, dtype: str) -> dict:
    """The learner's ``hierarchical_all_reduce`` on this rank's pattern: the tensor after it,
    what it returned, and the (color, key) of each ``comm.split`` it made on ``comm``."""
    splits, split = [], comm.split

    def recording_split(color, key=None):
        splits.append([color, key])
        return split(color, key)

    comm.split = recording_split
    t = pattern(comm.rank, n, DTYPES[dtype], comm.world_size)
    try:
        returned = namespace["hierarchical_all_reduce"](comm, t, per_node)
    finally:
        del comm.split
    same = returned is t or returned is None
    return {"tensor": t.detach().clone(), "splits": splits,
            "returned": None if same or not isinstance(returned, torch.Tensor)
            else returned.detach().clone(), "returned_type": type(returned).__name__}


def hierarchy_sum(n: int, world: int) -> torch.Tensor:
    return sum(pattern(r, n, torch.float64, world) for r in range(world))


# -- top-k with error feedback ---------------------------------------------------------------
def topk_grad(rank: int, step: int, n: int, seed: int) -> torch.Tensor:
    """Rank ``rank``'s gradient at ``step``: normal values (large ones of both signs, no
    ties), a few entries scaled up so that the top k differ from rank to rank."""
    g = torch.Generator().manual_seed(seed * 1000 + step * 31 + rank)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x[torch.randperm(n, generator=g)[: max(1, n // 10)]] *= 4.0
    return x


def topk_case(comm, namespace, n: int, k: int, steps: int, seed: int) -> list[dict]:
    """``steps`` steps of the learner's ``topk_step``, each fed the residual the previous
    one returned (zeros first): per step the residual given, what came back."""
    fn, residual, out = namespace["topk_step"], torch.zeros(n, dtype=torch.float64), []
    for step in range(steps):
        grad = topk_grad(comm.rank, step, n, seed)
        got = fn(comm, grad.clone(), residual.clone(), k)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and
                all(isinstance(x, torch.Tensor) for x in got)):
            return out + [{"returned": repr(got)[:120], "residual_in": residual}]
        averaged, new_residual = (x.detach().clone() for x in got)
        out.append({"residual_in": residual, "averaged": averaged, "residual": new_residual})
        if new_residual.shape != residual.shape:
            break
        residual = new_residual.to(torch.float64)
    return out


def sparse_of(corrected: torch.Tensor, k: int, signed: bool = False) -> torch.Tensor:
    """``corrected`` with all but its k entries of largest magnitude (or value) set to 0."""
    idx = torch.topk(corrected if signed else corrected.abs(), k).indices
    sent = torch.zeros_like(corrected)
    sent[idx] = corrected[idx]
    return sent


def topk_reference(grads, residuals, k: int, signed: bool = False, carry: bool = True):
    """(average of the sparse vectors, each rank's new residual) for one step."""
    corrected = [g + r if carry else g.clone() for g, r in zip(grads, residuals)]
    sent = [sparse_of(c, k, signed) for c in corrected]
    return sum(sent) / len(sent), [c - s for c, s in zip(corrected, sent)], sent


# -- PowerSGD (stretch) ------------------------------------------------------------------------
def powersgd_inputs(rank: int, m: int, n: int, r: int, low_rank: bool, seed: int):
    """(M, Q) on ``rank``: M of rank ``r`` when ``low_rank`` (then PowerSGD is exact), Q the
    same on every rank (a shared seed, as PowerSGD's warm start begins)."""
    g = torch.Generator().manual_seed(seed + 17 * rank)
    if low_rank:
        shared = torch.Generator().manual_seed(seed)  # one column space for every rank
        u = torch.randn(m, r, generator=shared, dtype=torch.float64)
        M = u @ torch.randn(r, n, generator=g, dtype=torch.float64)
    else:
        M = torch.randn(m, n, generator=g, dtype=torch.float64)
    q = torch.randn(n, r, generator=torch.Generator().manual_seed(seed + 99),
                    dtype=torch.float64)
    return M, q


def powersgd_case(comm, namespace, m: int, n: int, r: int, low_rank: bool, seed: int):
    M, Q = powersgd_inputs(comm.rank, m, n, r, low_rank, seed)
    got = namespace["powersgd_step"](comm, M.clone(), Q.clone())
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and
            all(isinstance(x, torch.Tensor) for x in got)):
        return {"returned": repr(got)[:120]}
    return {"approx": got[0].detach().clone(), "q": got[1].detach().clone()}


def orthonormal(P: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(P).Q


def powersgd_reference(Ms, Q, rank: int = 0, variant: str = "right"):
    """(M_hat, new Q) of one PowerSGD step over the ranks' ``Ms`` from the shared ``Q``, on
    ``rank``; ``variant`` replays a known mistake: "no_orth" (P not orthonormalised),
    "orth_before_avg" (each rank orthonormalises its own P, then averages), "sum" (sums, not
    averages), "local_q" (Q not averaged), "local_p" (P not averaged), "complete" (P
    orthonormalised by a complete QR: m columns)."""
    p = len(Ms)
    scale = 1.0 if variant == "sum" else 1.0 / p
    Ps = [M @ Q for M in Ms]
    if variant == "orth_before_avg":
        P = sum(orthonormal(x) for x in Ps) * scale
    elif variant == "local_p":  # each rank its own basis, in Q's average too
        P = orthonormal(Ps[rank])
        new_q = sum(M.T @ orthonormal(x) for M, x in zip(Ms, Ps)) * scale
        return P @ new_q.T, new_q
    elif variant == "complete":
        P = torch.linalg.qr(sum(Ps) * scale, mode="complete").Q
    else:
        P = sum(Ps) * scale
        P = P if variant == "no_orth" else orthonormal(P)
    Qs = [M.T @ P for M in Ms]
    new_q = Qs[rank] if variant == "local_q" else sum(Qs) * scale
    return P @ new_q.T, new_q
