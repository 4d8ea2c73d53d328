"""Wrong (and rightly different) answers to exercise 05: shards split along the wrong
dimension, f and g with the all-reduce on the wrong side or missing, the MLP's bias added on
every rank, GELU after the sum, a missing f, the library's own operators, and a
cross-entropy that overflows, stays local or gathers the logits."""

from . import Wrong

EX = "05_tensor_parallel"
SHARD, F_TEST, G_TEST = "test_shard_mlp", "test_copy_to_parallel", "test_reduce_from_parallel"
MLP, CE = "test_parallel_mlp", "test_vocab_parallel_cross_entropy"
F_DEF = ("class CopyToParallel(torch.autograd.Function):\n"
         "    @staticmethod\n    def forward(ctx, x, comm):\n")
G_DEF = F_DEF.replace("CopyToParallel", "ReduceFromParallel")
BACKWARD = "\n    @staticmethod\n    def backward(ctx, grad):\n"
MLP_DEF = "def parallel_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, comm):\n"
CE_DEF = "def vocab_parallel_cross_entropy(logits, targets, comm):\n"
CE_SETUP = """\
    part = logits.shape[-1]
    first = comm.rank * part
    top = logits.detach().max(dim=-1).values
    md.all_reduce(comm, top, op="max")
    shifted = logits - top[:, None]
    mine = (targets >= first) & (targets < first + part)
    local = (targets - first).clamp(0, part - 1)
"""


def shard(body: str) -> dict:
    return {"shard_mlp": "def shard_mlp(fc_weight, fc_bias, proj_weight, proj_bias, rank, "
                         "world_size):\n" + body}


def f_op(forward: str, backward: str) -> dict:
    return {"CopyToParallel": F_DEF + forward + BACKWARD + backward}


def g_op(forward: str, backward: str) -> dict:
    return {"ReduceFromParallel": G_DEF + forward + BACKWARD + backward}


def mlp(body: str) -> dict:
    return {"parallel_mlp": MLP_DEF + body}


def ce(body: str) -> dict:
    return {"vocab_parallel_cross_entropy": CE_DEF + body}


F_RIGHT_FORWARD = "        ctx.comm = comm\n        return x.view_as(x)\n"
G_RIGHT_FORWARD = "        return md.all_reduce(comm, x.clone(), op='sum')\n"
G_RIGHT_BACKWARD = "        return grad, None\n"
PIECES = """\
    return (fc_weight.chunk(world_size, 0)[rank], fc_bias.chunk(world_size)[rank],
            proj_weight.chunk(world_size, 1)[rank], proj_bias)
"""

WRONG = [
    # -- part 1: the shards
    Wrong("shard_fc_wrong_dimension", EX, shard(PIECES.replace(
        "fc_weight.chunk(world_size, 0)", "fc_weight.chunk(world_size, 1)")),
        {SHARD: "rank 0: c_fc's weight piece is (8, 2) [1000, 1001, 1004, 1005, ... (16 "
                "values)], expected the (4, 4) block [1000, 1001, 1002, 1003, ... (16 "
                "values)]; split along the wrong dimension: a column-parallel linear splits "
                "its OUTPUT features"}),
    Wrong("shard_proj_wrong_dimension", EX, shard(PIECES.replace(
        "proj_weight.chunk(world_size, 1)", "proj_weight.chunk(world_size, 0)")),
        {SHARD: "a row-parallel linear splits its INPUT features"}),
    Wrong("shard_proj_bias_split", EX, shard(PIECES.replace(
        "proj_bias)", "proj_bias.chunk(world_size)[rank])")),
        {SHARD: "c_proj's bias is not split: its output is the sum of every rank's partial "
                "result"}),
    Wrong("shard_proj_bias_divided", EX, shard(PIECES.replace(
        "proj_bias)", "proj_bias / world_size)")), {SHARD: "c_proj's bias is not split"}),
    Wrong("shard_fc_bias_whole", EX, shard(PIECES.replace(
        "fc_bias.chunk(world_size)[rank]", "fc_bias")),
        {SHARD: "c_fc's bias belongs to its output features"}),
    Wrong("shard_every_pth_row", EX, shard("""\
    return (fc_weight[rank::world_size], fc_bias[rank::world_size],
            proj_weight[:, rank::world_size], proj_bias)
"""), {SHARD: "take block r instead (tensor.chunk(world_size, dim)[rank])"}),
    Wrong("shard_transposed", EX, shard(PIECES.replace(
        "fc_weight.chunk(world_size, 0)[rank]", "fc_weight.t().chunk(world_size, 1)[rank]")),
        {SHARD: "that is the right block, transposed"}),
    Wrong("shard_as_list", EX, shard("""\
    return [fc_weight.chunk(world_size, 0)[rank].tolist(), fc_bias.chunk(world_size)[rank],
            proj_weight.chunk(world_size, 1)[rank], proj_bias]
"""), passes=True),
    # -- part 2: f
    Wrong("f_no_all_reduce_backward", EX, f_op(F_RIGHT_FORWARD, "        return grad, None\n"),
          {F_TEST: "it is only this rank's own gradient, missing the all-reduce in backward",
           MLP: "the gradients of the replicated input were not summed"}),
    Wrong("f_all_reduce_forward", EX, f_op(
        "        return md.all_reduce(comm, x.clone(), op='sum')\n", "        return grad, None\n"),
        {F_TEST: "the forward all-reduced. f is the identity forward",
         MLP: "the output differs from the full MLP's"}),
    Wrong("f_average", EX, f_op(F_RIGHT_FORWARD,
                                "        return md.all_reduce(ctx.comm, grad, op='avg'), None\n"),
          {F_TEST: "it is world_size times too small: the gradients must be summed",
           MLP: "it is world_size times too small: f's backward must sum"}),
    Wrong("f_library", EX, f_op("""\
        from minidist.parallel.tensor import copy_to_parallel
        return copy_to_parallel(x, comm)
""", "        return grad, None\n"),
        {F_TEST: "minidist.parallel.tensor.mappings.copy_to_parallel is not allowed",
         MLP: "is not allowed in this exercise"}),
    Wrong("f_returns_x_reduces_in_place", EX, f_op(
        "        ctx.comm = comm\n        return x\n",
        "        md.all_reduce(ctx.comm, grad)\n        return grad, None\n"), passes=True),
    Wrong("f_backward_no_gradient_for_comm", EX, f_op(
        F_RIGHT_FORWARD, "        return md.all_reduce(ctx.comm, grad.clone())\n"),
        {F_TEST: "returned an incorrect number of gradients (expected 2, got 1)",
         MLP: "returned an incorrect number of gradients (expected 2, got 1)"}),
    Wrong("f_reduce_to_rank_0", EX, f_op(
        F_RIGHT_FORWARD, "        return md.reduce(ctx.comm, grad.clone(), dst=0), None\n"),
        {F_TEST: "the values are right, but f's backward called md.reduce of 24 elements",
         MLP: "and backward md.reduce of 48 elements"}),
    Wrong("f_all_gather_and_sum", EX, f_op(
        F_RIGHT_FORWARD,
        "        return md.all_gather(ctx.comm, grad.contiguous()).sum(0), None\n"),
        {F_TEST: "the values are right, but f's backward called md.all_gather of 24 elements",
         MLP: "and backward md.all_gather of 48 elements"}),
    Wrong("f_broadcast_rank_0", EX, f_op(
        F_RIGHT_FORWARD, "        return md.broadcast(ctx.comm, grad.clone(), src=0), None\n"),
        {F_TEST: "it is only this rank's own gradient, missing the all-reduce in backward",
         MLP: "the gradients of the replicated input were not summed"}),
    Wrong("f_all_reduce_max", EX, f_op(
        F_RIGHT_FORWARD, "        return md.all_reduce(ctx.comm, grad.clone(), op='max'), None\n"),
        {F_TEST: "backward all-reduced with op='max': op=\"max\" keeps one rank's value",
         MLP: "backward all-reduced with op='max': x's gradient is the SUM over ranks"}),
    Wrong("f_all_reduce_per_row", EX, f_op(F_RIGHT_FORWARD, """\
        rows = [md.all_reduce(ctx.comm, row.clone()) for row in grad]
        return torch.stack(rows), None
"""), {F_TEST: "f's backward called md.all_reduce of 12 elements, md.all_reduce of 12 "
               "elements", MLP: "backward md.all_reduce of 24 elements, md.all_reduce of 24"}),
    Wrong("f_forward_returns_comm_too", EX, f_op(
        "        ctx.comm = comm\n        return x.view_as(x), comm\n",
        "        return md.all_reduce(ctx.comm, grad.clone()), None\n"),
        {F_TEST: "forward returns one tensor of x's shape (2, 3, 4)",
         MLP: "must be Tensor, not tuple"}),
    # -- part 3: g
    Wrong("g_no_all_reduce", EX, g_op("        return x.view_as(x)\n", G_RIGHT_BACKWARD),
          {G_TEST: "it is this rank's own partial sum", MLP: "it is this rank's partial result",
           CE: "the loss is"}),
    Wrong("g_all_reduce_backward", EX, g_op(
        "        ctx.comm = comm\n" + G_RIGHT_FORWARD,
        "        return md.all_reduce(ctx.comm, grad.clone()), None\n"),
        {G_TEST: "it is world_size times too large: backward all-reduced the gradient",
         MLP: "it is world_size times too large: the gradient was summed over ranks",
         CE: "the gradient of this rank's logits"}),
    Wrong("g_average", EX, g_op("        return md.all_reduce(comm, x.clone(), op='avg')\n",
                                G_RIGHT_BACKWARD),
          {G_TEST: "it is world_size times too small", MLP: "world_size times too small",
           CE: "the loss is"}),
    Wrong("g_library", EX, g_op("""\
        from minidist.parallel.tensor.mappings import ReduceFromParallel as Theirs
        return Theirs.apply(x, comm, "auto")
""", G_RIGHT_BACKWARD),
        {G_TEST: "minidist.parallel.tensor.mappings.ReduceFromParallel is not allowed",
         MLP: "is not allowed in this exercise", CE: "is not allowed in this exercise"}),
    Wrong("g_torch_process_group", EX, g_op("""\
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="file:///tmp/md-grading-tp-bypass",
                                    rank=comm.rank, world_size=comm.world_size)
        out = x.clone()
        dist.all_reduce(out)
        return out
""", G_RIGHT_BACKWARD),
        {G_TEST: "torch.distributed.init_process_group is not allowed",
         MLP: "is not allowed in this exercise", CE: "is not allowed in this exercise"}),
    Wrong("g_in_place", EX, g_op("        return md.all_reduce(comm, x)\n", G_RIGHT_BACKWARD),
          passes=True),
    Wrong("g_reduce_to_rank_0", EX, g_op(
        "        return md.reduce(comm, x.clone(), dst=0)\n", G_RIGHT_BACKWARD),
        {G_TEST: "the values are right, but g's forward called md.reduce of 24 elements",
         MLP: "forward called md.reduce of 48 elements", CE: "md.reduce of 12 elements"}),
    Wrong("g_all_gather_and_sum", EX, g_op(
        "        return md.all_gather(comm, x.contiguous()).sum(0)\n", G_RIGHT_BACKWARD),
        {G_TEST: "the values are right, but g's forward called md.all_gather of 24 elements",
         MLP: "forward called md.all_gather of 48 elements",
         CE: "md.all_gather of 12 elements"}),
    Wrong("g_reduce_scatter_then_all_gather", EX, g_op(
        "        part = md.reduce_scatter(comm, x.reshape(-1).clone())\n"
        "        return md.all_gather(comm, part).reshape(x.shape)\n", G_RIGHT_BACKWARD),
        {G_TEST: "g's forward called md.reduce_scatter of 24 elements, md.all_gather of",
         MLP: "forward called md.reduce_scatter of 48 elements",
         CE: "md.reduce_scatter of 12 elements"}),
    Wrong("g_backward_no_gradient", EX, g_op(G_RIGHT_FORWARD, "        return None, None\n"),
          {G_TEST: "no gradient reached the input: return it from backward",
           MLP: "the gradient of c_fc's weight shard is None",
           CE: "the gradient of this rank's logits is None"}),
    Wrong("g_backward_divided_by_world_size", EX, g_op(
        "        ctx.p = comm.world_size\n" + G_RIGHT_FORWARD,
        "        return grad / ctx.p, None\n"),
        {G_TEST: "it is world_size times too small: backward divided the gradient",
         MLP: "world_size times too small: the gradient was divided by world_size",
         CE: "world_size times too small: the gradient was divided by world_size"}),
    Wrong("g_backward_all_reduce_avg", EX, g_op(
        "        ctx.comm = comm\n" + G_RIGHT_FORWARD,
        "        return md.all_reduce(ctx.comm, grad.clone(), op='avg'), None\n"),
        {G_TEST: "the values are right, but g's backward called md.all_reduce of 24 elements",
         MLP: "and backward md.all_reduce of 48 elements, md.all_reduce of 48 elements",
         CE: "and backward md.all_reduce of 12 elements"}),
    # -- part 4: the MLP
    Wrong("mlp_bias_on_every_rank", EX, mlp("""\
    x = CopyToParallel.apply(x, comm)
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    return ReduceFromParallel.apply(F.linear(hidden, proj_weight, proj_bias), comm)
"""), {MLP: "c_proj's bias was added on every rank before the all-reduce, so the sum holds "
            "it 2 times"}),
    Wrong("mlp_no_f", EX, mlp("""\
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    return ReduceFromParallel.apply(F.linear(hidden, proj_weight), comm) + proj_bias
"""), {MLP: "the gradients of the replicated input were not summed: each rank's gradient "
            "of x covers only its slice of the hidden layer"}),
    Wrong("mlp_no_g", EX, mlp("""\
    x = CopyToParallel.apply(x, comm)
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    return F.linear(hidden, proj_weight) + proj_bias
"""), {MLP: "it is this rank's partial result: c_proj is row-parallel"}),
    Wrong("mlp_gelu_after_the_sum", EX, mlp("""\
    x = CopyToParallel.apply(x, comm)
    hidden = F.linear(x, fc_weight, fc_bias)
    return F.gelu(ReduceFromParallel.apply(F.linear(hidden, proj_weight), comm)) + proj_bias
"""), {MLP: "GELU is not linear"}),
    Wrong("mlp_bias_over_world_size", EX, mlp("""\
    x = CopyToParallel.apply(x, comm)
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    partial = F.linear(hidden, proj_weight, proj_bias / comm.world_size)
    return ReduceFromParallel.apply(partial, comm)
"""), {MLP: "you added c_proj's bias / world_size on every rank"}),
    Wrong("mlp_f_twice", EX, mlp("""\
    x = CopyToParallel.apply(CopyToParallel.apply(x, comm), comm)
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    return ReduceFromParallel.apply(F.linear(hidden, proj_weight), comm) + proj_bias
"""), {MLP: "world_size times too large: the input's gradient was summed twice"}),
    Wrong("mlp_all_reduce_outside_autograd", EX, mlp("""\
    x = CopyToParallel.apply(x, comm)
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    out = F.linear(hidden, proj_weight).detach()
    md.all_reduce(comm, out)
    return out + proj_bias
"""), {MLP: "the gradient of c_fc's weight shard is None"}),
    Wrong("mlp_one_all_reduce_per_sample", EX, mlp("""\
    x = CopyToParallel.apply(x, comm)
    hidden = F.gelu(F.linear(x, fc_weight, fc_bias))
    partial = F.linear(hidden, proj_weight)
    rows = [ReduceFromParallel.apply(row, comm) for row in partial]
    return torch.stack(rows) + proj_bias
"""), {MLP: "the values are right, but forward called md.all_reduce of 24 elements, "
            "md.all_reduce of 24 elements and backward md.all_reduce of 48 elements"}),
    Wrong("mlp_library_layers", EX, mlp("""\
    from minidist.parallel.tensor import RowParallelLinear
    return RowParallelLinear(proj_weight, proj_bias, comm)(F.gelu(F.linear(x, fc_weight, fc_bias)))
"""), {MLP: "minidist.parallel.tensor.layers.RowParallelLinear is not allowed"}),
    # -- part 5 (stretch): the cross-entropy
    Wrong("ce_no_maximum", EX, ce("""\
    part = logits.shape[-1]
    first = comm.rank * part
    sum_exp = ReduceFromParallel.apply(logits.exp().sum(dim=-1), comm)
    mine = (targets >= first) & (targets < first + part)
    local = (targets - first).clamp(0, part - 1)
    target_logit = ReduceFromParallel.apply(logits.gather(-1, local[:, None])[:, 0] * mine, comm)
    return (sum_exp.log() - target_logit).mean()
"""), {CE: "exp overflowed (one position's logits are near 800)"}),
    Wrong("ce_this_rank_only", EX, ce(CE_SETUP + """\
    sum_exp = shifted.exp().sum(dim=-1)
    target_logit = shifted.gather(-1, local[:, None])[:, 0] * mine
    return (sum_exp.log() - target_logit).mean()
"""), {CE: "the loss differs between ranks"}),
    Wrong("ce_target_on_every_rank", EX, ce(CE_SETUP + """\
    sum_exp = ReduceFromParallel.apply(shifted.exp().sum(dim=-1), comm)
    target_logit = ReduceFromParallel.apply(shifted.gather(-1, local[:, None])[:, 0], comm)
    return (sum_exp.log() - target_logit).mean()
"""), {CE: "where the target's logit lives on one rank"}),
    Wrong("ce_gathers_the_logits", EX, ce("""\
    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            ctx.rank, ctx.part = comm.rank, z.shape[-1]
            return torch.cat(md.all_gather(comm, z.contiguous()).unbind(0), dim=-1)

        @staticmethod
        def backward(ctx, grad):
            return grad[:, ctx.rank * ctx.part:(ctx.rank + 1) * ctx.part]

    return F.cross_entropy(Gather.apply(logits), targets)
"""), {CE: "the loss is right, but you called md.all_gather of"}),
    Wrong("ce_plain_all_reduce", EX, ce(CE_SETUP + """\
    sum_exp = shifted.exp().sum(dim=-1).detach()
    md.all_reduce(comm, sum_exp)
    target_logit = (shifted.gather(-1, local[:, None])[:, 0] * mine).detach()
    md.all_reduce(comm, target_logit)
    return (sum_exp.log() - target_logit).mean()
"""), {CE: "no gradient reached the logits: md.all_reduce is not differentiable"}),
]
