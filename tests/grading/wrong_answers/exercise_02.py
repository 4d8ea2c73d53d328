"""Wrong (and rightly different) answers to exercise 02."""

from . import Wrong

EX = "02_data_parallel"
SHARD, AVG, BUCKETS = "test_shard_indices", "test_average_gradients", "test_assign_buckets"
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


def average(body: str) -> dict:
    return {"average_gradients": "def average_gradients(comm, model):\n" + body}


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
    Wrong("average_no_division", EX, average("""\
    for param in model.parameters():
        if param.grad is not None:
            md.all_reduce(comm, param.grad, op="sum")
"""), {AVG: "2 times too large"}),
    Wrong("average_nothing", EX, average("    pass\n"),
          {AVG: "still this rank's own gradient"}),
    Wrong("average_frozen_too", EX, average("""\
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        md.all_reduce(comm, param.grad, op="avg")
"""), {AVG: "is frozen"}),
    Wrong("average_ddp", EX, average("""\
    md.DistributedDataParallel(model, comm)
"""), {AVG: "DistributedDataParallel is not allowed"}),
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
