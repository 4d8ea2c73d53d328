"""Exercise 09's tests: every rank's sum and the bytes that cross nodes for the hierarchical
all_reduce, top-k's average and residuals step by step with the bytes sent, and PowerSGD's
M_hat and new Q with its bytes."""

from __future__ import annotations

import math

import torch

from ...engine.feedback import Mistake, ranks_text, values
from .mistakes import (
    avg_hint,
    close,
    mismatch,
    power_hint,
    residual_hint,
    split_hint,
    sum_hint,
)
from .ranks import (
    DTYPES,
    hierarchy_case,
    hierarchy_sum,
    local_of,
    node_of,
    powersgd_case,
    powersgd_inputs,
    powersgd_reference,
    topk_case,
    topk_grad,
    topk_reference,
)

# world size -> [(per_node, n, dtype)]: 1 to 3 nodes of 1 to 4 ranks, lengths that do and
# do not divide by per_node
HIER_CASES = {4: [(2, 12, "float64"), (2, 9, "float64"), (2, 8, "float32")],
              6: [(3, 12, "float64"), (3, 10, "float64"), (2, 12, "float64"),
                  (2, 7, "float64")],
              8: [(4, 16, "float64"), (4, 13, "float32")],
              3: [(1, 10, "float64"), (3, 7, "float64")]}
TOPK_CASES = {2: [(64, 4, 4, 1), (20, 1, 3, 2)], 3: [(50, 5, 4, 3)],
              4: [(400, 8, 3, 4)]}  # world size -> [(n, k, steps, seed)]
POWER_CASES = {2: [(12, 8, 2, False, 1), (10, 6, 1, True, 2)],
               3: [(9, 7, 2, False, 3), (8, 8, 2, True, 4)]}  # (m, n, r, low_rank, seed)
INDEX_AND_VALUE = 16  # bytes of one sent entry: an int64 index and a float64 value


# -- part 1: hierarchical all_reduce -----------------------------------------------------------
def _hier_label(world: int, per_node: int, n: int, dtype: str) -> str:
    nodes = world // per_node
    return (f"{nodes} node{'s' * (nodes > 1)} of {per_node} rank{'s' * (per_node > 1)} "
            f"(world_size={world}), a {dtype} tensor of {n} elements")


def check_hierarchical(learner) -> str:
    for _, (per_node, n, dtype), label, results in learner.each_world(
            hierarchy_case, "hierarchical_all_reduce", HIER_CASES, _hier_label):
        _judge_sums(results, per_node, n, dtype, label)
        _judge_inter_node(results, per_node, n, dtype, label)
    n_cases = sum(len(c) for c in HIER_CASES.values())
    return (f"every rank holds the sum of all ranks' tensors; every rank sends exactly its ring "
            f"share of its shard across nodes (2(N-1)·n·e in all, only between ranks of the "
            f"same local index) and each node exactly a reduce-scatter and an all-gather "
            f"inside, in {n_cases} clusters of 1 to 3 nodes of 1 to 4 ranks")


def _judge_sums(results: list[dict], per_node: int, n: int, dtype: str, label: str) -> None:
    world, want = len(results), hierarchy_sum(n, len(results)).to(DTYPES[dtype])
    for rank, res in enumerate(results):
        got = res["value"]
        t, returned = got["tensor"], got["returned"]
        if torch.equal(t, want):
            continue
        if isinstance(returned, torch.Tensor) and returned.shape == want.shape and \
                torch.equal(returned.to(want.dtype), want):
            raise Mistake(f"with {label}: rank {rank} returned a new tensor holding the sums, "
                          "but left t unchanged: write the result into t (t.copy_(...)), as "
                          "md.all_reduce does in place")
        if t.shape != want.shape or t.dtype != want.dtype:
            raise Mistake(f"with {label}: on rank {rank}, t now has shape {tuple(t.shape)} "
                          f"and dtype {t.dtype}, expected {tuple(want.shape)}, {want.dtype}")
        i = int((t != want).nonzero()[0])
        value = float(t[i])
        raise Mistake(f"with {label}: on rank {rank}, t[{i}] = {value:g}, expected the sum "
                      f"over all {world} ranks, {float(want[i]):g}: "
                      f"{sum_hint(value, i, rank, per_node, world)}"
                      f"{split_hint(results, per_node)}")


def _judge_inter_node(results: list[dict], per_node: int, n: int, dtype: str,
                      label: str) -> None:
    """Across nodes, only between ranks of one local index (else: a flat ring), and exactly
    a ring's bytes on every rank (``_judge_per_rank``); inside each node, exactly a
    reduce-scatter's and an all-gather's (``_judge_in_node``)."""
    world = len(results)
    for rank, res in enumerate(results):
        for dst, nbytes in sorted(res["traffic"]["sent_to"].items()):
            dst = int(dst)
            if node_of(dst, per_node) == node_of(rank, per_node) or \
                    local_of(dst, per_node) == local_of(rank, per_node):
                continue
            same = [r for r in range(world) if r != rank and
                    local_of(r, per_node) == local_of(rank, per_node)]
            raise Mistake(
                f"with {label}: rank {rank} (node {node_of(rank, per_node)}, local index "
                f"{local_of(rank, per_node)}) sent {nbytes} bytes to rank {dst} (node "
                f"{node_of(dst, per_node)}, local index {local_of(dst, per_node)}): "
                "across nodes a rank exchanges only with the ranks that share its local "
                f"index (here {ranks_text(same)}), each carrying one shard; everything "
                "else stays inside the node (a flat all_reduce over comm crosses nodes "
                f"between neighbours){split_hint(results, per_node)}")
    e = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    across = [_bytes_to(res, rank, per_node, other_node=True) for rank, res in
              enumerate(results)]
    _judge_per_rank(across, per_node, n, e, label)
    inside = [_bytes_to(res, rank, per_node, other_node=False) for rank, res in
              enumerate(results)]
    _judge_in_node(inside, per_node, n, e, label)


def _bytes_to(res: dict, rank: int, per_node: int, other_node: bool) -> int:
    return sum(b for d, b in res["traffic"]["sent_to"].items()
               if (node_of(int(d), per_node) != node_of(rank, per_node)) == other_node)


def shard_conventions(n: int, per_node: int) -> dict[str, list[int]]:
    """Each local index's shard length, as a right answer may cut t: padded to per_node
    equal shards (``md.all_gather`` needs one shape), ``torch.tensor_split``'s, ``chunk``'s."""
    c = math.ceil(n / per_node)
    return {"padded": [c] * per_node,
            "tensor_split": [n // per_node + (i < n % per_node) for i in range(per_node)],
            "chunk": [max(0, min(c, n - i * c)) for i in range(per_node)]}


def ring_share_fits(sent: int, shard: int, nodes: int, e: int) -> bool:
    """A ring of ``nodes`` ranks on a shard of ``shard`` elements: each rank sends 2(N-1)
    chunks of floor or ceil(shard/N) elements."""
    lo, hi = shard // nodes, -(-shard // nodes)
    return 2 * (nodes - 1) * lo * e <= sent <= 2 * (nodes - 1) * hi * e


def _judge_per_rank(across: list[int], per_node: int, n: int, e: int, label: str) -> None:
    """Exact: each local index's ranks send 2(N-1)·s·e across nodes together (s: its shard),
    each its ring share; a rank that sends nothing across, or a whole tensor, loses."""
    world = len(across)
    nodes = world // per_node
    group = [sum(across[r] for r in range(world) if local_of(r, per_node) == i)
             for i in range(per_node)]
    for shards in shard_conventions(n, per_node).values():
        if all(group[i] == 2 * (nodes - 1) * shards[i] * e for i in range(per_node)) and all(
                ring_share_fits(across[r], shards[local_of(r, per_node)], nodes, e)
                for r in range(world)):
            return
    formula = 2 * (nodes - 1) * n * e
    total = sum(across)
    share = 2 * (nodes - 1) * math.ceil(n / per_node) * e / nodes
    head = (f"with {label}: the ranks sent {', '.join(map(str, across))} bytes across nodes "
            f"(ranks 0 to {world - 1}), {total} in all, where a ring across the N={nodes} "
            f"nodes on each rank's 1/{per_node} shard sends exactly 2(N-1)/N·n/per_node·e "
            f"= {share:g} per rank (2(N-1)·n·e = {formula} in all)")
    idle = [r for r in range(world) if across[r] == 0]
    if total == 0:
        raise Mistake(f"{head}: nothing crossed nodes, yet the sums arrived: the data must "
                      "travel in comm's messages (not a file, not shared memory)")
    if idle and nodes > 1 and per_node > 1:
        busy = [r for r in range(world) if across[r]]
        raise Mistake(f"{head}: only {ranks_text(busy)} crossed nodes while "
                      f"{ranks_text(idle)} sent nothing across: every rank carries its own "
                      "shard across nodes, each on its own network card (a leader that "
                      "carries the whole tensor leaves the others idle and its own link "
                      f"{per_node} times as loaded). Reduce-scatter inside the node first, "
                      "then all_reduce each shard across nodes between the ranks of one local "
                      "index")
    if per_node > 1 and total >= formula * per_node:
        raise Mistake(f"{head}: inter-node traffic is {total / formula:g} times the formula: "
                      f"each rank sent the whole tensor across nodes, not its 1/{per_node} "
                      "shard. Reduce-scatter inside the node first, so that each rank carries "
                      "only its shard across, then all-gather the summed shards inside the "
                      "node")
    raise Mistake(f"{head}: {total / formula:.2f} times the formula. Only the shard a rank "
                  "owns after the reduce-scatter crosses nodes, once reduced and once back, "
                  'in a ring (md.all_reduce(across, shard, algorithm="ring"))')


def _judge_in_node(inside: list[int], per_node: int, n: int, e: int, label: str) -> None:
    """Exact: in each node a ring reduce-scatter and all-gather of the tensor (padded or not)
    move (per_node-1)·n·e each."""
    world = len(inside)
    sizes = {n, per_node * math.ceil(n / per_node)}
    allowed = {(per_node - 1) * (a + b) * e for a in sizes for b in sizes}
    for node in range(world // per_node):
        ranks = [r for r in range(world) if node_of(r, per_node) == node]
        got = sum(inside[r] for r in ranks)
        if got not in allowed:
            want = 2 * (per_node - 1) * n * e
            raise Mistake(
                f"with {label}: the ranks of node {node} ({ranks_text(ranks)}) sent {got} "
                f"bytes to each other, where a reduce-scatter and an all-gather inside the "
                f"node move exactly 2(per_node-1)·n·e = {want} (n padded to a multiple of "
                "per_node, or not)" + ("; nothing moved inside the node, yet the sums "
                                       "arrived: the data must travel in comm's messages" if
                                       got == 0 else ""))


# -- part 2: top-k with error feedback ---------------------------------------------------------
def check_topk(learner) -> str:
    for world, (n, k, steps, seed), label, results in learner.each_world(
            topk_case, "topk_step", TOPK_CASES, lambda p, n, k, *_: f"world_size={p}, n={n}, "
                                                                    f"k={k}"):
        runs = [r["value"] for r in results]
        for step in range(steps):
            _judge_topk_step(runs, step, (n, k, seed), label)
        total = sum(r["traffic"]["bytes_sent"] for r in results)
        _judge_topk_bytes(total, world, (n, k, steps), label)
    return ("the average of the ranks' top-k vectors and each rank's residual equal the "
            "float64 oracle at every step of 3 to 4 steps, each fed the residual you returned, "
            "on 2 to 4 ranks; exactly k values and k indices per rank travel")


def _judge_topk_step(runs: list[list[dict]], step: int, case: tuple, label: str) -> None:
    n, k, seed = case
    world, where = len(runs), f"with {label}, step {step}"
    for rank, run in enumerate(runs):
        if step < len(run) and "returned" in run[step]:
            raise Mistake(f"{where}: rank {rank}'s topk_step returned {run[step]['returned']}; "
                          "return the pair (averaged, new_residual) of tensors")
    def grads_of(s: int) -> list[torch.Tensor]:
        return [topk_grad(r, s, n, seed) for r in range(world)]

    grads = grads_of(step)
    res_in = [run[step]["residual_in"] for run in runs]
    avg_want, res_want, sent = topk_reference(grads, res_in, k)
    for rank, run in enumerate(runs):
        avg = run[step]["averaged"]
        if not close(avg, avg_want):
            what = mismatch(avg, avg_want, f"rank {rank}'s averaged gradient")
            raise Mistake(f"{where}: {what}: "
                          f"{avg_hint(avg, grads, res_in, (k, step, rank), runs, grads_of)}")
    for rank, run in enumerate(runs):
        res = run[step]["residual"]
        if not close(res, res_want[rank]):
            corrected = grads[rank] + res_in[rank]
            what = mismatch(res, res_want[rank], f"rank {rank}'s new residual")
            raise Mistake(f"{where}: {what}: "
                          f"{residual_hint(res, corrected, grads[rank], sent[rank], step)}")


def _judge_topk_bytes(total: int, world: int, case: tuple, label: str) -> None:
    """Exact: an all-gather of k values and k indices sends (p-1)·k·(8+8) bytes per rank
    per step, however it is written (md.all_gather, sends to each rank, one stacked tensor)."""
    n, k, steps = case
    want = steps * world * (world - 1) * k * INDEX_AND_VALUE
    if total == want:
        return
    dense = steps * 2 * (world - 1) * n * 8
    why = ("nothing travelled, yet the averages arrived: the data must travel in comm's "
           "messages (not a file, not shared memory)" if total == 0 else
           "fewer bytes than k values and k indices: every rank's entries must reach every "
           "rank in comm's messages" if total < want else
           "Send only the k values and their indices (md.all_gather), and build the dense "
           "average from them")
    raise Mistake(f"with {label}: the ranks sent {total} bytes in all over {steps} steps, "
                  f"where exchanging each rank's k={k} values and k indices moves exactly "
                  f"{want} (an all-gather of k float64 values and k int64 indices, "
                  f"(p-1)·k·(8+8) bytes per rank per step); all-reducing the dense gradient "
                  f"moves {dense}. {why}")


# -- part 3 (stretch): one PowerSGD step ------------------------------------------------------
def _power_label(world: int, m: int, n: int, r: int, low: bool, _) -> str:
    return (f"world_size={world}, M of shape ({m}, {n}){' (of rank r)' if low else ''}, "
            f"rank r={r}")


def check_powersgd(learner) -> str:
    for world, case, label, results in learner.each_world(
            powersgd_case, "powersgd_step", POWER_CASES, _power_label):
        _judge_powersgd([r["value"] for r in results], case, label)
        total = sum(r["traffic"]["bytes_sent"] for r in results)
        _judge_powersgd_bytes(total, world, case, label)
    return ("M ~ P Q^T and the new Q equal the float64 oracle on 2 and 3 ranks (exact on "
            "gradients of rank r), with exactly 2(p-1)(m+n)·r·8 bytes in all: P and Q, never M")


def _judge_powersgd(results: list[dict], case: tuple, label: str) -> None:
    m, n, r, low, seed = case
    world = len(results)
    Ms = [powersgd_inputs(rank, m, n, r, low, seed)[0] for rank in range(world)]
    Q = powersgd_inputs(0, m, n, r, low, seed)[1]
    for rank, got in enumerate(results):
        if "returned" in got:
            raise Mistake(f"with {label}: rank {rank}'s powersgd_step returned "
                          f"{got['returned']}; return the pair (M_hat, new_Q) of tensors")
        want, want_q = powersgd_reference(Ms, Q, rank)
        if not close(got["approx"], want):
            what = mismatch(got["approx"], want, f"rank {rank}'s M_hat")
            raise Mistake(f"with {label}: {what}: "
                          f"{power_hint(got['approx'], Ms, Q, rank)}")
        q = got["q"]
        if not (isinstance(q, torch.Tensor) and q.shape == want_q.shape and all(
                close(q[:, j], want_q[:, j]) or close(q[:, j], -want_q[:, j])
                for j in range(r))):
            raise Mistake(f"with {label}: rank {rank}'s new Q is {values(q)}, expected "
                          f"{values(want_q)} (up to the sign of each column): the new Q is "
                          f"the average over the ranks of M^T P, shape ({n}, {r}), with the "
                          "orthonormalised P")


def _judge_powersgd_bytes(total: int, world: int, case: tuple, label: str) -> None:
    m, n, r, _, _ = case
    formula = 2 * (world - 1) * (m + n) * r * 8
    if total == formula:  # exact: less means P or Q came some other way
        return
    dense = 2 * (world - 1) * m * n * 8
    why = (f"that is at least what all-reducing M itself costs ({dense}): send only P "
           f"({m}x{r}) and Q ({n}x{r})" if total >= dense else
           "only P and Q travel, each all-reduced once" if total > formula else
           "fewer bytes than two ring all_reduces of P and Q: each must travel in comm's "
           'messages, all-reduced once (md.all_reduce(comm, x, op="avg", algorithm="ring"))')
    raise Mistake(f"with {label}: the ranks sent {total} bytes in all, where two all_reduces "
                  f"of P ({m}x{r}) and Q ({n}x{r}) move 2(p-1)(m+n)·r·8 = {formula}: {why}")

