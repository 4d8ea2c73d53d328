"""Wrong (and rightly different) answers to exercise 09: the whole tensor carried across nodes,
a flat ring, a node colour that assumes 2 ranks per node, the library's hierarchical
all_reduce; a residual not carried, top-k by signed value, a sum for an average, a dense
all_reduce, a residual that keeps the sent entries; PowerSGD without orthonormalising, with
M itself all-reduced, or with torch's hook."""

from . import Wrong

EX = "09_communication_efficiency"
HIER, TOPK, POWER = "test_hierarchical_all_reduce", "test_topk_step", "test_powersgd_step"
HIER_DEF = "def hierarchical_all_reduce(comm, t, per_node):\n"
RIGHT_HIER = """\
    node = comm.split(color=comm.rank // per_node, key=comm.rank)
    across = comm.split(color=comm.rank % per_node, key=comm.rank)
    flat = t.reshape(-1)
    n = flat.numel()
    padded = torch.zeros(per_node * math.ceil(n / per_node), dtype=t.dtype)
    padded[:n] = flat
    shard = md.reduce_scatter(node, padded)
    md.all_reduce(across, shard, algorithm="ring")
    flat.copy_(md.all_gather(node, shard).reshape(-1)[:n])
    return t
"""
TOPK_DEF = "def topk_step(comm, grad, residual, k):\n"
RIGHT_TOPK = """\
    corrected = grad + residual
    idx = torch.topk(corrected.abs(), k).indices
    values = corrected[idx]
    new_residual = corrected.clone()
    new_residual[idx] = 0.0
    all_idx = md.all_gather(comm, idx)
    all_values = md.all_gather(comm, values)
    summed = torch.zeros_like(grad)
    summed.index_add_(0, all_idx.reshape(-1), all_values.reshape(-1))
    return summed / comm.world_size, new_residual
"""
POWER_DEF = "def powersgd_step(comm, M, Q):\n"
RIGHT_POWER = """\
    P = M @ Q
    md.all_reduce(comm, P, op="avg")
    P = torch.linalg.qr(P).Q
    Q = M.T @ P
    md.all_reduce(comm, Q, op="avg")
    return P @ Q.T, Q
"""


def hier(body: str) -> dict:
    return {"hierarchical_all_reduce": HIER_DEF + body}


def topk(body: str) -> dict:
    return {"topk_step": TOPK_DEF + body}


def power(body: str) -> dict:
    return {"powersgd_step": POWER_DEF + body}


WRONG = [
    # -- part 1: hierarchical all_reduce
    Wrong("hier_whole_tensor_across_nodes", EX, hier("""\
    node = comm.split(color=comm.rank // per_node, key=comm.rank)
    across = comm.split(color=comm.rank % per_node, key=comm.rank)
    md.all_reduce(node, t)
    md.all_reduce(across, t, algorithm="ring")
    return t
"""), {HIER: "with 2 nodes of 2 ranks (world_size=4), a float64 tensor of 12 elements: "
             "the ranks sent 96, 96, 96, 96 bytes across nodes (ranks 0 to 3), 384 in all, "
             "where a ring across the N=2 nodes on each rank's 1/2 shard sends exactly "
             "2(N-1)/N·n/per_node·e = 48 per rank (2(N-1)·n·e = 192 in all): inter-node "
             "traffic is 2 times the formula: each rank sent the whole tensor across nodes, "
             "not its 1/2 shard"}),
    Wrong("hier_flat_ring", EX, hier("""\
    md.all_reduce(comm, t, algorithm="ring")
    return t
"""), {HIER: "rank 1 (node 0, local index 1) sent 144 bytes to rank 2 (node 1, local index 0): "
             "across nodes a rank exchanges only with the ranks that share its local index "
             "(here rank 3)"}),
    Wrong("hier_node_colour_assumes_2_per_node", EX, {"hierarchical_all_reduce": (
        HIER_DEF + RIGHT_HIER.replace("color=comm.rank // per_node", "color=comm.rank // 2"))},
        {HIER: "In your comm.split call 1, rank 2 and rank 3 used the same colour 1, but rank "
               "2 is on node 0 with local index 2 and rank 3 on node 1 with local index 0"}),
    Wrong("hier_average_not_sum", EX, {"hierarchical_all_reduce": (
        HIER_DEF + RIGHT_HIER.replace('algorithm="ring")', 'op="avg", algorithm="ring")'))},
        {HIER: "that is the sum divided by 2: an average crept in"}),
    Wrong("hier_library", EX, hier("""\
    md.all_reduce(comm, t, algorithm="hierarchical")
    return t
"""), {HIER: 'md.all_reduce(..., algorithm="hierarchical") is not allowed in this exercise'}),
    Wrong("hier_send_recv_and_auto", EX, hier("""\
    node = comm.split(color=comm.rank // per_node, key=comm.rank)
    across = comm.split(color=comm.rank % per_node, key=comm.rank)
    flat = t.reshape(-1)
    n, p = flat.numel(), node.world_size
    size = math.ceil(n / p)
    padded = torch.zeros(size * p, dtype=t.dtype)
    padded[:n] = flat
    pieces = list(padded.view(p, size))
    right, left = (node.rank + 1) % p, (node.rank - 1) % p
    buf = torch.empty(size, dtype=t.dtype)
    for step in range(p - 1):  # ring reduce-scatter by hand
        send_i, recv_i = (node.rank - step - 1) % p, (node.rank - step - 2) % p
        req = node.irecv(buf, left)
        node.send(pieces[send_i].clone(), right)
        req.wait()
        pieces[recv_i] += buf
    mine = (node.rank - p) % p
    md.all_reduce(across, pieces[mine], algorithm="ring")
    gathered = md.all_gather(node, pieces[mine])
    for src in range(p):
        pieces[(src - p) % p].copy_(gathered[src])
    flat.copy_(padded[:n])
    return t
"""), passes=True),
    # -- part 2: top-k with error feedback
    Wrong("topk_residual_not_carried", EX, topk(RIGHT_TOPK.replace(
        "corrected = grad + residual", "corrected = grad.clone()")),
        {TOPK: "the residual was not carried to the next step: here the top k were taken from "
               "the gradient alone, without the residual handed in (add it first: corrected = "
               "grad + residual); what was held back at step 0 is lost for good. After 2 steps "
               "the transmitted sum plus the residuals differs from the true sum of the "
               "gradients by up to"}),
    Wrong("topk_signed_not_magnitude", EX, topk(RIGHT_TOPK.replace(
        "torch.topk(corrected.abs(), k)", "torch.topk(corrected, k)")),
        {TOPK: "the indices are those of the largest values by signed value, not by "
               "magnitude"}),
    Wrong("topk_sum_not_average", EX, topk(RIGHT_TOPK.replace(
        "return summed / comm.world_size, new_residual", "return summed, new_residual")),
        {TOPK: "the result is the sum of the ranks' sparse gradients, not their average: "
               "divide by world_size (2)"}),
    Wrong("topk_dense_all_reduce", EX, topk("""\
    corrected = grad + residual
    idx = torch.topk(corrected.abs(), k).indices
    sparse = torch.zeros_like(grad)
    sparse[idx] = corrected[idx]
    new_residual = corrected - sparse
    md.all_reduce(comm, sparse, op="avg")
    return sparse, new_residual
"""), {TOPK: "all-reducing the dense gradient moves 4096. Send only the k values and their "
             "indices (md.all_gather)"}),
    Wrong("topk_residual_keeps_sent", EX, topk(RIGHT_TOPK.replace(
        "    new_residual[idx] = 0.0\n", "")),
        {TOPK: "the new residual still holds the k entries that were sent: zero them there"}),
    Wrong("topk_library", EX, topk("""\
    from minidist.compression import topk_compress
    return topk_compress(grad + residual, k)
"""), {TOPK: "is not allowed in this exercise"}),
    Wrong("topk_sorted_and_a_list", EX, topk("""\
    corrected = grad + residual
    idx = torch.argsort(corrected.abs(), descending=True)[:k]
    pairs = md.all_gather(comm, torch.stack([idx.double(), corrected[idx]]))
    out = torch.zeros_like(grad)
    for r in range(comm.world_size):
        out.index_add_(0, pairs[r, 0].long(), pairs[r, 1])
    left = corrected.clone()
    left[idx] = 0
    return [out / comm.world_size, left]
"""), passes=True),
    Wrong("topk_written_not_added", EX, topk(RIGHT_TOPK.replace(
        "summed.index_add_(0, all_idx.reshape(-1), all_values.reshape(-1))",
        "summed[all_idx.reshape(-1)] = all_values.reshape(-1)")),
        {TOPK: "where several ranks chose the same index, only one rank's value arrived: the "
               "entries were written (out[idx] = values), so each overwrote the one before"}),
    Wrong("topk_sends_grad_values", EX, topk(RIGHT_TOPK.replace(
        "values = corrected[idx]", "values = grad[idx]")),
        {TOPK: "step 1: rank 0's averaged gradient: 6 of 64 values differ: [18] = -0.881661 "
               "(expected -1.87062), [19] = -0.796019 (expected -0.334424), [30] = "
               "-0.815734 (expected -1.39195) ...: the right indices, but the values sent are "
               "the gradient's: send the corrected values, grad + residual"}),
    Wrong("topk_residual_minus_average", EX, topk(RIGHT_TOPK.replace(
        "    new_residual = corrected.clone()\n    new_residual[idx] = 0.0\n", "").replace(
        "    return summed / comm.world_size, new_residual\n", """\
    averaged = summed / comm.world_size
    return averaged, corrected - averaged
""")), {TOPK: "new_residual = (grad + residual) - this rank's own sparse vector (not the "
              "average)"}),
    Wrong("topk_residual_from_grad", EX, topk("""\
    corrected = grad + residual
    idx = torch.topk(corrected.abs(), k).indices
    sparse = torch.zeros_like(grad)
    sparse[idx] = corrected[idx]
    new_residual = grad - sparse
    all_idx = md.all_gather(comm, idx)
    all_values = md.all_gather(comm, sparse[idx])
    summed = torch.zeros_like(grad)
    summed.index_add_(0, all_idx.reshape(-1), all_values.reshape(-1))
    return summed / comm.world_size, new_residual
"""), {TOPK: "the residual was not carried to the next step: the new residual dropped the "
             "residual handed in; new_residual = grad + residual - sent"}),
    Wrong("topk_all_gather_dense", EX, topk("""\
    corrected = grad + residual
    idx = torch.topk(corrected.abs(), k).indices
    sparse = torch.zeros_like(grad)
    sparse[idx] = corrected[idx]
    everyone = md.all_gather(comm, sparse)  # (p, n): the zeros travel too
    return everyone.mean(0), corrected - sparse
"""), {TOPK: "with world_size=2, n=64, k=4: the ranks sent 4096 bytes in all over 4 steps, "
             "where exchanging each rank's k=4 values and k indices moves exactly 512"}),
    # -- part 3 (stretch): PowerSGD
    Wrong("power_no_orthonormalisation", EX, power(RIGHT_POWER.replace(
        "    P = torch.linalg.qr(P).Q\n", "")),
        {POWER: "P was not orthonormalised before Q = M^T P"}),
    Wrong("power_all_reduce_M", EX, power("""\
    M = M.clone()
    md.all_reduce(comm, M, op="avg")
    P = torch.linalg.qr(M @ Q).Q
    Q = M.T @ P
    return P @ Q.T, Q
"""), {POWER: "that is at least what all-reducing M itself costs (1536): send only P (12x2) "
              "and Q (8x2)"}),
    Wrong("power_q_not_averaged", EX, power(RIGHT_POWER.replace(
        '    md.all_reduce(comm, Q, op="avg")\n', "")),
        {POWER: "Q = M^T P was not averaged over the ranks"}),
    Wrong("power_orthonormalised_before_average", EX, power("""\
    P = torch.linalg.qr(M @ Q).Q.contiguous()
    md.all_reduce(comm, P, op="avg")
    Q = M.T @ P
    md.all_reduce(comm, Q, op="avg")
    return P @ Q.T, Q
"""), {POWER: "each rank orthonormalised its own P before averaging: all-reduce (average) P "
              "first, then orthonormalise"}),
    Wrong("power_sum_not_average", EX, power(RIGHT_POWER.replace('op="avg"', 'op="sum"')),
          {POWER: "the sum, not the average: divide the all-reduced P and Q by world_size"}),
    Wrong("power_p_not_averaged", EX, power(RIGHT_POWER.replace(
        '    md.all_reduce(comm, P, op="avg")\n', "")),
        {POWER: "P = M Q was not averaged over the ranks before it was orthonormalised"}),
    Wrong("power_returns_transpose", EX, power(RIGHT_POWER.replace(
        "return P @ Q.T, Q", "return Q @ P.T, Q")),
        {POWER: "that is M_hat transposed: M_hat = P Q^T has M's shape (12, 8)"}),
    Wrong("power_complete_qr", EX, power(RIGHT_POWER.replace(
        "torch.linalg.qr(P).Q", 'torch.linalg.qr(P, mode="complete").Q')),
        {POWER: "P was orthonormalised with a complete QR"}),
    Wrong("power_all_reduces_q_first", EX, power("""\
    md.all_reduce(comm, Q, op="avg")  # every rank must start from the same Q
""" + RIGHT_POWER), {POWER: "only P and Q travel, each all-reduced once"}),
    Wrong("power_torch_hook", EX, power("""\
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as h
    state = h.PowerSGDState(process_group=None, matrix_approximation_rank=Q.shape[1])
    return h.powerSGD_hook(state, M), Q
"""), {POWER: "is not allowed in this exercise"}),
]
