"""Wrong (and rightly different) answers to exercise 06: the shard boundaries, stage 1's step
and the stretch's reduction of a gradient bucket into its owners."""

from . import Wrong

EX = "06_zero_sharding"
BOUNDS, STEP, BUCKET = "test_shard_bounds", "test_zero1_step", "test_reduce_bucket"


def bounds(body: str) -> dict:
    return {"shard_bounds": "def shard_bounds(numel, rank, world_size):\n" + body}


MAKE = "        state[\"optimizer\"] = make_optimizer([state[\"shard\"]])\n"
GATHER = "    params.copy_(md.all_gather(comm, shard.detach()).reshape(-1)[:n])\n"


def step(update: str, first: str = MAKE, gather: str = GATHER) -> dict:
    """The solution's step with its optimizer's creation, update or gather replaced."""
    return {"zero1_step": f"""\
def zero1_step(comm, params, grad, state, make_optimizer):
    p, n = comm.world_size, params.numel()
    start, end = shard_bounds(n, comm.rank, p)
    padded = (end - start) * p
    if not state:
        flat = torch.zeros(padded, dtype=params.dtype)
        flat[:n] = params
        state["shard"] = nn.Parameter(flat[start:end].clone())
{first}\
    flat_grad = torch.zeros(padded, dtype=grad.dtype)
    flat_grad[:n] = grad
    shard = state["shard"]
{update}\
    state["optimizer"].step()
    shard.grad = None
{gather}"""}


AVERAGE = "    shard.grad = md.reduce_scatter(comm, flat_grad, op=\"avg\")\n"


def bucket(body: str) -> dict:
    return {"reduce_bucket": "def reduce_bucket(comm, bucket_grad, lo, grad_shard):\n"
                             "    p, s = comm.world_size, len(grad_shard)\n"
                             "    hi = lo + len(bucket_grad)\n" + body}


def owners(add: str) -> str:
    return f"""\
    for owner in range(p):
        start, end = max(lo, owner * s), min(hi, (owner + 1) * s)
        if start >= end:
            continue
        piece = bucket_grad[start - lo:end - lo].clone()
        md.reduce(comm, piece, dst=owner)
        if comm.rank == owner:
            {add}
"""


WRONG = [
    Wrong("zero_bounds_clamped_to_numel", EX, bounds("""\
    shard = -(-numel // world_size)
    return rank * shard, min((rank + 1) * shard, numel)
"""), {BOUNDS: "the shard boundaries ignore padding: with 10 elements on 4 ranks each shard "
               "is 3 (2 padding elements on rank 3). Your shards hold [3, 3, 3, 1]",
       STEP: "zero1_step failed on rank"}),
    Wrong("zero_bounds_last_takes_the_rest", EX, bounds("""\
    shard = numel // world_size
    return rank * shard, numel if rank == world_size - 1 else (rank + 1) * shard
"""), {BOUNDS: "the shard boundaries ignore padding", STEP: "zero1_step failed on rank"}),
    Wrong("zero_bounds_floor", EX, bounds("""\
    shard = numel // world_size
    return rank * shard, (rank + 1) * shard
"""), {BOUNDS: "every shard has ceil(numel / world_size) = 3 elements",
       STEP: "zero1_step failed on rank"}),
    Wrong("zero_bounds_library", EX, bounds("""\
    from minidist.parallel.zero import FlatShards
    group = FlatShards([nn.Parameter(torch.zeros(numel))], world_size, rank)
    return group.bounds()
"""), {BOUNDS: "minidist.parallel.zero.flat_shards.FlatShards is not allowed in this exercise",
       STEP: "is not allowed in this exercise"}),
    Wrong("zero_step_full_tensor", EX, {"zero1_step": """\
def zero1_step(comm, params, grad, state, make_optimizer):
    if not state:
        state["optimizer"] = make_optimizer([params])
    params.grad = md.all_reduce(comm, grad.clone(), op="avg")
    state["optimizer"].step()
"""}, {STEP: "rank 0 updated the full tensor (its optimizer state holds 10 elements, its "
             "shard is 3)"}),
    Wrong("zero_step_unpadded_reduce_scatter", EX, {"zero1_step": """\
def zero1_step(comm, params, grad, state, make_optimizer):
    p, r, n = comm.world_size, comm.rank, params.numel()
    pieces = params.tensor_split(p)
    if not state:
        state["shard"] = nn.Parameter(pieces[r].clone())
        state["optimizer"] = make_optimizer([state["shard"]])
    state["shard"].grad = md.reduce_scatter(comm, grad, op="avg")
    state["optimizer"].step()
    params.copy_(md.all_gather(comm, state["shard"].detach()).reshape(-1))
"""}, {STEP: "with 10 elements on 4 ranks each shard is 3 (2 padding elements on rank 3)"}),
    Wrong("zero_step_summed", EX, step(
        "    shard.grad = md.reduce_scatter(comm, flat_grad, op=\"sum\")\n"),
        {STEP: "the parameters are those of gradients summed over the ranks, not averaged"}),
    Wrong("zero_step_own_gradient", EX, step("    shard.grad = flat_grad[start:end]\n"),
          {STEP: "each shard stepped with its owner's own gradient"}),
    Wrong("zero_step_no_all_gather", EX, step(
        AVERAGE, gather="    stop = min(end, n)\n"
                        "    if stop > start:\n"
                        "        params[start:stop] = shard.detach()[:stop - start]\n"),
        {STEP: "rank 0's parameters changed only inside its own shard [0, 3): all-gather"}),
    Wrong("zero_step_new_optimizer_every_step", EX, step(
        AVERAGE, first="        pass\n"
                       "    state[\"optimizer\"] = make_optimizer([state[\"shard\"]])\n"),
        {STEP: "rank 0 called make_optimizer 3 times in 3 step(s): a new optimizer starts its "
               "momentum"}),
    Wrong("zero_step_not_in_place", EX, step(
        AVERAGE, gather="    params = md.all_gather(comm, shard.detach()).reshape(-1)[:n]\n"),
        {STEP: "the parameters did not change: update params in place"}),
    Wrong("zero_step_all_reduce", EX, step(
        "    shard.grad = md.all_reduce(comm, flat_grad, op=\"avg\")[start:end].clone()\n"),
        {STEP: "called md.all_reduce of 12, md.all_gather of 3 (elements sent); stage 1 "
               "needs exactly md.reduce_scatter of the padded gradient (12 elements"}),
    Wrong("zero_step_gathers_twice", EX, step(
        AVERAGE, gather=GATHER + "    md.all_gather(comm, shard.detach())\n"),
        {STEP: "One all-gather of the updated shards already gives every rank every value"}),
    Wrong("zero_step_library", EX, {"zero1_step": """\
def zero1_step(comm, params, grad, state, make_optimizer):
    if not state:
        state["zero"] = md.ZeRO(nn.Linear(1, 1).double(), comm, stage=1)
"""}, {STEP: "minidist.parallel.zero.zero_optimizer.ZeRO is not allowed in this exercise"}),
    Wrong("zero_bucket_summed", EX, bucket(owners(
        "grad_shard[start - owner * s:end - owner * s] += piece")),
        {BUCKET: "holds the sum over the ranks, not the average"}),
    Wrong("zero_bucket_overwrites", EX, bucket(owners(
        "grad_shard[start - owner * s:end - owner * s] = piece / p")),
        {BUCKET: "holds the last backward pass's gradient only: add into grad_shard"}),
    Wrong("zero_bucket_all_reduce", EX, bucket("""\
    total = md.all_reduce(comm, bucket_grad.clone(), op="avg")
    start, end = max(lo, comm.rank * s), min(hi, (comm.rank + 1) * s)
    if start < end:
        grad_shard[start - comm.rank * s:end - comm.rank * s] += total[start - lo:end - lo]
"""), {BUCKET: "reduce_bucket called md.all_reduce"}),
    Wrong("zero_bucket_plain_reduce_scatter", EX, bucket("""\
    mine = md.reduce_scatter(comm, bucket_grad, op="avg")
    grad_shard[:len(mine)] += mine
"""), {BUCKET: "3 of 3 values wrong: [0] = -3.5 (expected 2.25)"}),
    Wrong("zero_bucket_whole_bucket_per_owner", EX, bucket("""\
    for owner in range(p):
        start, end = max(lo, owner * s), min(hi, (owner + 1) * s)
        if start >= end:
            continue
        total = md.reduce(comm, bucket_grad.clone(), dst=owner)
        if comm.rank == owner:
            grad_shard[start - owner * s:end - owner * s] += total[start - lo:end - lo] / p
"""), {BUCKET: "the gradient shards are right, but on rank 0 reduce_bucket(7, 10) called "
               "md.reduce of 3 elements to rank 2, md.reduce of 3 elements to rank 3; the "
               "bucket [7, 10) needs exactly md.reduce of 2 to rank 2, md.reduce of 1 to "
               "rank 3"}),
    Wrong("zero_bucket_padded_reduce_scatter", EX, bucket("""\
    flat = torch.zeros(s * p, dtype=bucket_grad.dtype)
    flat[lo:hi] = bucket_grad
    grad_shard += md.reduce_scatter(comm, flat, op="avg")
"""), {BUCKET: "reduce_bucket(7, 10) called md.reduce_scatter of 12 elements; the bucket "
               "[7, 10) needs exactly md.reduce of 2 to rank 2, md.reduce of 1 to rank 3"}),
    Wrong("zero_bucket_own_shard_first", EX, bucket(owners(
        "grad_shard[start - owner * s:end - owner * s] += piece / p").replace(
        "    for owner in range(p):\n",
        "    for k in range(p):\n        owner = (comm.rank + k) % p\n")),
        {BUCKET: "CollectiveMismatchError"}),
    Wrong("zero_bucket_every_rank_adds", EX, bucket(owners(
        "pass\n        grad_shard[start - owner * s:end - owner * s] += piece / p")),
        {BUCKET: "Element i of grad_shard is flat element"}),
    Wrong("zero_bucket_offset_from_bucket_start", EX, bucket(owners(
        "grad_shard[start - lo:end - lo] += piece / p")),
        {BUCKET: "at `grad_shard[start - lo:end - lo] += piece / p` (line 11 of cell 14): "
                 "RuntimeError: The size of tensor a (2) must match the size of tensor b (3)"}),
    Wrong("zero_bucket_avg_then_divided", EX, bucket(owners(
        "grad_shard[start - owner * s:end - owner * s] += piece / p").replace(
        "dst=owner)", "dst=owner, op=\"avg\")")),
        {BUCKET: "holds the average divided by world_size once more: md.reduce with "
                 "op=\"avg\" already divides"}),
    Wrong("zero_bucket_no_skip_of_empty_overlaps", EX, bucket(owners(
        "grad_shard[start - owner * s:end - owner * s] += piece / p").replace(
        "        if start >= end:\n            continue\n", "")),
        {BUCKET: "RuntimeError: The size of tensor a (0) must match the size of tensor b (2)"}),
    Wrong("zero_bucket_avg_op", EX, bucket(owners(
        "grad_shard[start - owner * s:end - owner * s] += piece").replace(
        "dst=owner)", "dst=owner, op=\"avg\")")), passes=True),
]
