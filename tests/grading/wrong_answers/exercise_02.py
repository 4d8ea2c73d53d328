"""Wrong (and rightly different) answers to exercise 02."""

from . import Wrong

EX = "02_data_parallel"
SHARD, HOOKS, BUCKETS = "test_shard_indices", "test_register_allreduce_hooks", "test_assign_buckets"
ORDER = """\
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    total = math.ceil(n / world_size) * world_size
"""


def shard(body: str) -> dict:
    return {"shard_indices":
            "def shard_indices(n, rank, world_size, shuffle=True, seed=0, epoch=0):\n" + body}


def hooks(body: str) -> dict:
    return {"register_allreduce_hooks": "def register_allreduce_hooks(model, comm):\n" + body}


END_OF_BACKWARD = "torch.autograd.Variable._execution_engine.queue_callback"
def buckets(body: str) -> dict:
    return {"assign_buckets": "def assign_buckets(sizes, cap):\n" + body}


WRONG = [
    Wrong("shard_ignores_epoch", EX, shard(ORDER.replace("seed + epoch", "seed") + """\
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    return indices[rank:total:world_size]
"""), {SHARD: "seed the generator with seed + epoch"}),
    Wrong("shard_pads_once", EX, shard(ORDER + """\
    indices += indices[: total - len(indices)]
    return indices[rank:total:world_size]
"""), {SHARD: "repeat the list more than once"}),
    Wrong("shard_contiguous", EX, shard(ORDER + """\
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    per = total // world_size
    return indices[rank * per:(rank + 1) * per]
"""), {SHARD: "split the wrong way"}),
    Wrong("shard_torch_sampler", EX, shard("""\
    from torch.utils.data import DistributedSampler
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank,
                                 shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)
"""), {SHARD: "torch.utils.data.distributed.DistributedSampler is not allowed"}),
    Wrong("shard_minidist_sampler", EX, shard("""\
    from minidist.parallel.data.sampler import shard_indices as theirs
    return theirs(n, rank, world_size, shuffle, seed, epoch)
"""), {SHARD: "minidist.parallel.data.sampler.shard_indices is not allowed"}),
    Wrong("shard_tensor_result", EX, shard(ORDER + """\
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    return torch.tensor(indices[rank:total:world_size], dtype=torch.int64)
"""), passes=True),
    Wrong("average_no_division", EX, hooks("""\
    def add_up(param):
        md.all_reduce(comm, param.grad, op="sum")

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(add_up)
"""), {HOOKS: "2 times too large"}),
    Wrong("hooks_return_the_tensor", EX, hooks("""\
    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(
                lambda p: md.all_reduce(comm, p.grad, op="avg"))
"""), {HOOKS: "post accumulate grad hooks should return None"}),
    Wrong("hooks_nothing", EX, hooks("    pass\n"), {HOOKS: "still this rank's own gradient"}),
    Wrong("hooks_frozen_too", EX, hooks("""\
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(
            lambda p: md.all_reduce(comm, p.grad, op="avg") and None)
"""), {HOOKS: "cannot register a hook on a tensor that doesn't require gradient"}),
    Wrong("hooks_after_backward", EX, hooks(f"""\
    def average_all():
        for param in model.parameters():
            if param.grad is not None:
                md.all_reduce(comm, param.grad, op="avg")

    last = [p for p in model.parameters() if p.requires_grad][-1]
    last.register_hook(lambda grad: {END_OF_BACKWARD}(average_all))
"""), {HOOKS: "the first all-reduce started only once backward had computed every gradient"}),
    Wrong("hooks_one_flat_all_reduce", EX, hooks(f"""\
    def average_all():
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        md.all_reduce(comm, flat, op="avg")
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))

    last = [p for p in model.parameters() if p.requires_grad][-1]
    last.register_hook(lambda grad: {END_OF_BACKWARD}(average_all))
"""), {HOOKS: "expected one all-reduce per parameter that has a gradient (7)"}),
    Wrong("hooks_ddp", EX, hooks("    md.DistributedDataParallel(model, comm)\n"),
          {HOOKS: "DistributedDataParallel is not allowed"}),
    Wrong("hooks_naive_wrapper", EX, hooks("""\
    from minidist.parallel.data.naive import DataParallelNaive
    DataParallelNaive(model, comm)
"""), {HOOKS: "minidist.parallel.data.naive.DataParallelNaive is not allowed"}),
    Wrong("hooks_naive_method", EX, hooks("""\
    from minidist.parallel.data.naive import DataParallelNaive
    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(
                lambda p: DataParallelNaive._all_reduce_grad(None, p))
"""), {HOOKS: "DataParallelNaive is not allowed"}),
    Wrong("hooks_torch_ddp", EX, hooks("""\
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file:///tmp/md-grading-ddp-bypass",
                            rank=comm.rank, world_size=comm.world_size)
    torch.nn.parallel.DistributedDataParallel(model)
"""), {HOOKS: "torch.distributed.init_process_group is not allowed"}),
    Wrong("hooks_on_the_gradient", EX, hooks("""\
    for param in model.parameters():
        if param.requires_grad:
            param.register_hook(lambda grad: md.all_reduce(comm, grad.clone(), op="avg"))
"""), passes=True),
    Wrong("buckets_forward_order", EX, buckets("""\
    out, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        if filled >= cap:
            out.append(current)
            current, filled = [], 0
    return out + ([current] if current else [])
"""), {BUCKETS: "fill buckets in reverse order"}),
    Wrong("buckets_close_before_cap", EX, buckets("""\
    out, current, filled = [], [], 0
    for i in reversed(range(len(sizes))):
        if current and filled + sizes[i] > cap:
            out.append(current)
            current, filled = [], 0
        current.append(i)
        filled += sizes[i]
    return out + ([current] if current else [])
"""), {BUCKETS: "close a bucket as soon as it holds cap bytes or more"}),
    Wrong("buckets_library", EX, buckets("""\
    from minidist.parallel.data.buckets import assign_buckets as theirs
    return theirs([torch.empty(s, dtype=torch.uint8) for s in sizes], cap)
"""), {BUCKETS: "minidist.parallel.data.buckets.assign_buckets is not allowed"}),
    Wrong("buckets_tuples", EX, buckets("""\
    out, current, filled = [], [], 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        filled += sizes[i]
        if filled >= cap:
            out.append(tuple(current))
            current, filled = [], 0
    return tuple(out + ([tuple(current)] if current else []))
"""), passes=True),
]

# -- more wrong answers (issue 27: ten per graded test) -------------------------------------------
PADDED = """\
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    return indices[rank:total:world_size]
"""
CLOSE = """\
        if filled >= cap:
            out.append(current)
            current, filled = [], 0
"""
REVERSED = """\
    out, current, filled = [], [], 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        filled += sizes[i]
"""
WRONG += [
    Wrong("shard_no_padding", EX, shard(ORDER + """\
    return indices[rank::world_size]
"""), {SHARD: "every rank gets ceil(n / world_size)"}),
    Wrong("shard_drops_the_tail", EX, shard(ORDER.replace(
        "math.ceil(n / world_size) * world_size", "n // world_size * world_size") + """\
    return indices[rank:total:world_size]
"""), {SHARD: "as drop_last=True does"}),
    Wrong("shard_pads_with_last_index", EX, shard(ORDER + """\
    indices += [indices[-1]] * (total - len(indices))
    return indices[rank:total:world_size]
"""), {SHARD: "pad with the list's own first indices"}),
    Wrong("shard_seeded_by_rank", EX, shard(ORDER.replace("seed + epoch", "seed + epoch + rank")
                                            + PADDED),
          {SHARD: "must draw the same permutation: seed the generator with seed + epoch only"}),
    Wrong("shard_python_random", EX, shard("""\
    import random
    indices = list(range(n))
    if shuffle:
        random.Random(seed + epoch).shuffle(indices)
    total = math.ceil(n / world_size) * world_size
""" + PADDED), {SHARD: "permute with torch.randperm(n, generator=g)"}),
    Wrong("buckets_strictly_more_than_cap", EX, buckets(REVERSED + CLOSE.replace(">=", ">") + """\
    return out + ([current] if current else [])
"""), {BUCKETS: "close it at cap bytes or more (>= cap, not > cap)"}),
    Wrong("buckets_last_bucket_dropped", EX, buckets(REVERSED + CLOSE + """\
    return out
"""), {BUCKETS: "the last, partly full bucket is missing"}),
    Wrong("buckets_cap_in_megabytes", EX, buckets("""\
    cap = cap * 1024 * 1024  # as DDP's bucket_cap_mb
""" + REVERSED + CLOSE + """\
    return out + ([current] if current else [])
"""), {BUCKETS: "cap is in bytes already"}),
    Wrong("buckets_empty_last_bucket", EX, buckets(REVERSED + CLOSE + """\
    return out + [current]
"""), {BUCKETS: "is empty"}),
    Wrong("buckets_carry_the_overflow", EX, buckets(REVERSED + """\
        if filled >= cap:
            out.append(current)
            current, filled = [], filled - cap
    return out + ([current] if current else [])
"""), {BUCKETS: "a new bucket starts empty"}),
    Wrong("buckets_indices_counted_forward", EX, buckets("""\
    out, current, filled = [], [], 0
    for i, size in enumerate(reversed(sizes)):
        current.append(i)
        filled += size
""" + CLOSE + """\
    return out + ([current] if current else [])
"""), {BUCKETS: "the parameters' own indices"}),
    Wrong("buckets_flat_list", EX, buckets("""\
    return list(reversed(range(len(sizes))))
"""), {BUCKETS: "return a list of buckets, each a list of parameter indices"}),
    Wrong("buckets_hold_sizes", EX, buckets("""\
    out, current, filled = [], [], 0
    for i in reversed(range(len(sizes))):
        current.append(sizes[i])
        filled += sizes[i]
""" + CLOSE + """\
    return out + ([current] if current else [])
"""), {BUCKETS: "the buckets hold the parameters' sizes"}),
]
