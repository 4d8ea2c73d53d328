"""Wrong (and rightly different) answers to exercise 10, the bug zoo: for each of the seven
bugs the given buggy function itself (copied into the learner's cell unchanged, as a
learner's first try is), a half-fix, a call to the library's own version, and a fix in
another shape that must earn full points. The buggy code is read from the notebook's locked
``buggy_<name>`` cells, so these are exactly the bugs the learner is given."""

import functools

import nbformat

from . import ROOT, Wrong

EX = "10_bug_zoo"
AVG, RING, INF, EPOCHS, ZERO, FP16, PIPE = (
    "test_average_gradients", "test_ring_all_reduce", "test_sharded_step", "test_train_epochs",
    "test_zero_sgd_step", "test_fp16_step", "test_pipeline_1f1b")


@functools.cache
def _given() -> dict[str, str]:
    nb = nbformat.read(str(ROOT / "solutions" / f"{EX}.ipynb"), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("buggy_")}


def buggy(name: str, *edits: tuple[str, str]) -> dict:
    """The learner's cell for ``name``: the given buggy code under the learner's name, with
    ``edits`` (old, new) applied, each of which must match exactly once."""
    source = _given()[f"buggy_{name}"].replace(f"def buggy_{name}(", f"def {name}(") + "\n"
    for old, new in edits:
        assert source.count(old) == 1, f"{name}: {old!r} is not in the buggy code once"
        source = source.replace(old, new)
    return {name: source}


SUM = '            md.all_reduce(comm, p.grad, op="sum")\n'
RING_RS = ("""\
        mine = (r - step - 1) % p
        request = comm.isend(x, right)
        comm.recv(incoming, left)
        request.wait()
        chunks[mine].add_(incoming.tensor_split(p)[mine])
""", """\
        mine = (r - step - 1) % p
        request = comm.isend(chunks[(r - step) % p], right)
        part = torch.empty_like(chunks[mine])
        comm.recv(part, left)
        request.wait()
        chunks[mine].add_(part)
""")
LOCAL_FLAG = "    found_inf = any(not torch.isfinite(g).all() for g in grads)\n"
AGREE = LOCAL_FLAG + """\
    flag = torch.tensor([float(found_inf)])
    md.all_reduce(comm, flag, op="{op}")
"""
EPOCH_LOOP = "    for epoch in range(epochs):\n"
OWN = "    own = params.tensor_split(p)[r]  # my shard of the parameters\n"
BACKWARD = "    loss.backward()  # float16 gradients\n"
TO_FLOAT = "        w.grad = p.grad.float()\n"
WARMUP = "    warmup = p - r - 1  # forwards in flight before the first backward\n"
COOLDOWN = "    for _ in range(warmup):  # cool-down: the backwards still in flight\n"

WRONG = [
    # -- 1. gradients summed, not averaged
    Wrong("zoo10_avg_summed", EX, buggy("average_gradients"),
          {AVG: "they are 2x the average (the sum over the ranks), so every SGD step is 2x too "
                "large and the run trains as if lr were 2x larger: divide the summed gradients "
                "by comm.world_size"}),
    Wrong("zoo10_avg_divides_by_two", EX, buggy("average_gradients", (
        SUM, SUM + "            p.grad /= 2\n")),
        {AVG: "with world_size=4: after average_gradients rank 0's weight gradient is"}),
    Wrong("zoo10_avg_divided_twice", EX, buggy("average_gradients", (
        SUM, '            md.all_reduce(comm, p.grad, op="avg")\n'
             "            p.grad /= comm.world_size\n")),
        {AVG: "they are 0.5x the average over the 2 ranks: divide the sum by comm.world_size, "
              "once"}),
    Wrong("zoo10_avg_local_only", EX, buggy("average_gradients", (SUM, "            pass\n")),
          {AVG: "they are this rank's own gradients: sum them over the ranks first"}),
    Wrong("zoo10_avg_ddp", EX, buggy("average_gradients", (
        SUM, "            md.DistributedDataParallel(model, comm)\n")),
        {AVG: "is not allowed in this exercise"}),
    Wrong("zoo10_avg_op_avg", EX, buggy("average_gradients", (
        SUM, '            md.all_reduce(comm, p.grad, op="avg")\n')), passes=True),
    # -- 2. a ring that sends whole buffers
    Wrong("zoo10_ring_whole_buffers", EX, buggy("ring_all_reduce"),
          {RING: "with world_size=4, n=16 float64 elements: the sum is right, but each rank sent "
                 "768 bytes, 4.0x the 2(p-1)/p·n = 192 bytes a ring sends (ranks 0 to 3 sent "
                 "768, 768, 768, 768): each of the 2(p-1) steps must send ONE chunk"}),
    Wrong("zoo10_ring_chunks_in_reduce_scatter_only", EX, buggy("ring_all_reduce", RING_RS),
        {RING: "2.5x the 2(p-1)/p·n = 192 bytes a ring sends"}),
    Wrong("zoo10_ring_library", EX, buggy("ring_all_reduce", (
        "    chunks = x.tensor_split(p)  # views into x\n",
        "    chunks = x.tensor_split(p)  # views into x\n    md.all_reduce(comm, x)\n"
        "    return\n")),
        {RING: "is not allowed in this exercise"}),
    Wrong("zoo10_ring_gather_adds", EX, buggy("ring_all_reduce", (
        "        chunks[mine].copy_(incoming.tensor_split(p)[mine])\n",
        "        chunks[mine].add_(incoming.tensor_split(p)[mine])\n")),
        {RING: "with world_size=4, n=16 float64 elements: rank 0 ends with"}),
    # -- 3. found_inf not agreed
    Wrong("zoo10_inf_not_agreed", EX, buggy("sharded_step"),
          {INF: "with world_size=4, step 1: the ranks went separate ways: rank 1 skipped the "
                "optimizer step that ranks 0, 2 and 3 took (only rank 1's gradients held inf)"}),
    Wrong("zoo10_inf_agreed_with_min", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="min") + "    found_inf = flag.item() > 0\n")),
        {INF: "with world_size=4, step 1: every rank took the step although rank 1's gradients "
              "held inf"}),
    Wrong("zoo10_inf_scale_halved_locally", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="max")), (
        "    if found_inf:\n        state[\"scale\"] /= 2\n        return False\n",
        "    if found_inf:\n        state[\"scale\"] /= 2\n    if flag.item() > 0:\n"
        "        return False\n")),
        {INF: "with world_size=4, step 1: the loss scales are rank 0: 1024, rank 1: 512, "
              "rank 2: 1024, rank 3: 1024, expected 512 on every rank"}),
    Wrong("zoo10_inf_grad_scaler", EX, buggy("sharded_step", (
        LOCAL_FLAG, LOCAL_FLAG + "    md.GradScaler(comm=comm)\n")),
        {INF: "is not allowed in this exercise"}),
    Wrong("zoo10_inf_agreed_by_sum", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="sum") + "    found_inf = flag.item() > 0\n")),
        passes=True),
    # -- 4. a sampler without set_epoch
    Wrong("zoo10_sampler_no_set_epoch", EX, buggy("train_epochs"),
          {EPOCHS: "with world_size=2, 10 samples, 3 epochs: on rank 0, epoch 0 and epoch 1 "
                   "visit the samples in the same order ([4, 7, 3, 0, 6]): the sampler "
                   "shuffles with seed + epoch, and its epoch never changed"}),
    Wrong("zoo10_sampler_set_epoch_after_the_epoch", EX, buggy("train_epochs", (
        "            train_step(batch)\n",
        "            train_step(batch)\n        sampler.set_epoch(epoch)\n")),
        {EPOCHS: "epoch 0 and epoch 1 visit the samples in the same order"}),
    Wrong("zoo10_sampler_epoch_plus_one", EX, buggy("train_epochs", (
        EPOCH_LOOP, EPOCH_LOOP + "        sampler.set_epoch(epoch + 1)\n")),
        {EPOCHS: "in epoch 0 rank 0 visited [5, 1, 0, 9, 7], torch's DistributedSampler with "
                 "set_epoch(0) gives [4, 7, 3, 0, 6]"}),
    Wrong("zoo10_sampler_new_seed_each_epoch", EX, buggy("train_epochs", (
        "    sampler = md.DistributedSampler(dataset, comm, shuffle=True, seed=0)\n"
        "    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)\n"
        + EPOCH_LOOP,
        EPOCH_LOOP + "        sampler = md.DistributedSampler(dataset, comm, seed=epoch)\n"
        "        loader = torch.utils.data.DataLoader(dataset, batch_size=4, "
        "sampler=sampler)\n")), passes=True),
    # -- 5. a ZeRO shard off by the padding
    Wrong("zoo10_zero_torch_split", EX, buggy("zero_sgd_step"),
          {ZERO: "with n=10 parameters on 4 ranks (shards of 3, the last 2 of the padded 12 are "
                 "padding): after one step, rank 0's parameters 8 and 9 are wrong: [8] = 0 (a "
                 "padding zero; expected -0.826702); [9] = -1.67171 (parameter 8 moved by "
                 "parameter 9's gradient; expected 1.42533). In the padded layout they belong "
                 "to ranks 2 and 3's shards [r·3, (r+1)·3)"}),
    Wrong("zoo10_zero_chunk_not_tensor_split", EX, buggy("zero_sgd_step", (
        OWN, "    own = params.chunk(p)[r]\n")),
        {ZERO: "with n=9 parameters on 4 ranks (shards of 3, the last 3 of the padded 12 are "
               "padding): zero_sgd_step failed on rank 3 at `own = params.chunk(p)[r]`"}),
    Wrong("zoo10_zero_library", EX, buggy("zero_sgd_step", (
        OWN, OWN + "    md.ZeRO(torch.nn.Linear(1, 1), comm, stage=1)\n")),
        {ZERO: "is not allowed in this exercise"}),
    # -- 6. float16 without loss scaling
    Wrong("zoo10_fp16_no_loss_scaling", EX, buggy("fp16_step"),
          {FP16: "with world_size=1, after step 0: rank 0's float32 master weight has not moved "
                 "(the float32 gradient moves it by 8.9e-06): every float16 gradient "
                 "underflowed to 0"}),
    Wrong("zoo10_fp16_not_unscaled", EX, buggy("fp16_step", (
        BACKWARD, "    (loss * 2.0 ** 16).backward()\n")),
        {FP16: "x as far as the float32 gradient moves it: the gradients still hold the "
               "scale: divide them by it (in float32) before optimizer.step()"}),
    Wrong("zoo10_fp16_unscaled_in_float16", EX, buggy("fp16_step", (
        BACKWARD, "    (loss * 2.0 ** 16).backward()\n"), (
        TO_FLOAT, "        w.grad = (p.grad / 2.0 ** 16).float()\n")),
        {FP16: "THEN divide by the scale (in float16 the division underflows again)"}),
    Wrong("zoo10_fp16_torch_scaler", EX, buggy("fp16_step", (
        BACKWARD, '    torch.amp.GradScaler("cpu").scale(loss).backward()\n')),
        {FP16: "is not allowed in this exercise"}),
    Wrong("zoo10_fp16_scale_1024", EX, buggy("fp16_step", (
        BACKWARD, "    (loss * 1024.0).backward()\n"), (
        TO_FLOAT, "        w.grad = p.grad.float() / 1024.0\n")), passes=True),
    # -- 7. a 1F1B step that deadlocks
    Wrong("zoo10_pipe_warmup_not_capped", EX, buggy("pipeline_1f1b"),
          {PIPE: "the schedule deadlocks at m=2 micro-batches on 4 stages: stage 0 ran 2 "
                 "forward and 2 backward passes and waits in recv for a gradient from stage 1; "
                 "stages 1, 2 and 3 finished"}),
    Wrong("zoo10_pipe_backward_first", EX, buggy("pipeline_1f1b", (
        "        forward(i, xs[i])\n        backward()\n",
        "        backward()\n        forward(i, xs[i])\n")),
        {PIPE: "pipeline_1f1b failed on rank 1"}),
    Wrong("zoo10_pipe_library", EX, buggy("pipeline_1f1b", (
        WARMUP, WARMUP + '    md.pipeline.actions("1f1b", p, m)\n')),
        {PIPE: "is not allowed in this exercise"}),
    Wrong("zoo10_pipe_cooldown_capped", EX, buggy("pipeline_1f1b", (
        COOLDOWN, "    for _ in range(min(warmup, m)):  # cool-down\n")), passes=True),
]


# -- more wrong fixes, each a different kind of mistake on the same function (issue 27) ------
SOLVED_INF = (LOCAL_FLAG, AGREE.format(op="max") + "    found_inf = flag.item() > 0\n")
UNSCALE = "    for g in grads:\n        g.div_(state[\"scale\"])\n"
RING_FIX = """\
def ring_all_reduce(comm, x):
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    chunks = x.tensor_split(p)
    for step in range(p - 1):
        send, mine = chunks[(r - step) % p], chunks[(r - step - 1) % p]
        incoming = torch.empty_like(mine)
        request = comm.isend(send, right)
        comm.recv(incoming, left)
        request.wait()
        mine.add_(incoming)
    for step in range(p - 1):
        send, mine = chunks[(r + 1 - step) % p], chunks[(r - step) % p]
        request = comm.isend(send, right)
        comm.recv(mine, left)
        request.wait()
"""


def ring(*edits: tuple[str, str]) -> dict:
    source = RING_FIX
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return {"ring_all_reduce": source}


ZERO_FIX = """\
def zero_sgd_step(comm, params, grad, lr):
    n, p, r = params.numel(), comm.world_size, comm.rank
    shard = -(-n // p)
    padded = torch.zeros(shard * p, dtype=grad.dtype)
    padded[:n] = grad
    g = md.reduce_scatter(comm, padded, op="avg")
    start, end = min(r * shard, n), min((r + 1) * shard, n)
    mine = torch.zeros(shard, dtype=params.dtype)
    mine[:end - start] = params[start:end] - lr * g[:end - start]
    params.copy_(md.all_gather(comm, mine).flatten()[:n])
"""
GATHER = "    params.copy_(md.all_gather(comm, mine).flatten()[:n])\n"


def zero(*edits: tuple[str, str]) -> dict:
    source = ZERO_FIX
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return {"zero_sgd_step": source}


SCALED = (BACKWARD, "    (loss * 2.0 ** 16).backward()\n")
UNSCALED = (TO_FLOAT, "        w.grad = p.grad.float() / 2.0 ** 16\n")
CAPPED = (WARMUP, "    warmup = min(p - r - 1, m)\n")

WRONG += [
    # -- 1. average_gradients
    Wrong("zoo10_avg_copy_not_written_back", EX, buggy("average_gradients", (
        SUM, "            g = p.grad.clone()\n            md.all_reduce(comm, g, op=\"sum\")\n"
             "            g /= comm.world_size\n")),
        {AVG: "they are this rank's own gradients: sum them over the ranks first"}),
    Wrong("zoo10_avg_only_rank0_divides", EX, buggy("average_gradients", (
        SUM, SUM + "            if comm.rank == 0:\n                p.grad /= comm.world_size\n")),
        {AVG: "rank 1's weight gradient is"}),
    Wrong("zoo10_avg_reduce_to_rank0", EX, buggy("average_gradients", (
        SUM, '            md.reduce(comm, p.grad, 0, op="sum")\n'
             "            p.grad /= comm.world_size\n")),
        {AVG: "the sum never reached this rank (md.reduce leaves it on dst only)"}),
    Wrong("zoo10_avg_floor_division", EX, buggy("average_gradients", (
        SUM, SUM + "            p.grad //= comm.world_size\n")),
        {AVG: "divide by comm.world_size"}),
    Wrong("zoo10_avg_divides_the_weights", EX, buggy("average_gradients", (
        SUM, SUM + "            p.data /= comm.world_size\n")),
        {AVG: "they are 2x the average (the sum over the ranks)"}),
    # -- 2. ring_all_reduce
    Wrong("zoo10_ring_rs_copies_not_adds", EX, ring(("        mine.add_(incoming)\n",
                                                     "        mine.copy_(incoming)\n")),
          {RING: "the sum over the ranks is"}),
    Wrong("zoo10_ring_ag_sends_the_chunk_it_receives", EX, ring((
        "send, mine = chunks[(r + 1 - step) % p], chunks[(r - step) % p]",
        "send, mine = chunks[(r - step) % p], chunks[(r - step) % p]")),
        {RING: "sender and receiver must use the same dtype and number of elements"}),
    Wrong("zoo10_ring_reversed_direction", EX, ring((
        "right, left = (r + 1) % p, (r - 1) % p", "right, left = (r - 1) % p, (r + 1) % p")),
        {RING: "sender and receiver must use the same dtype and number of elements"}),
    Wrong("zoo10_ring_incoming_sized_like_chunk_0", EX, ring((
        "incoming = torch.empty_like(mine)", "incoming = torch.empty_like(chunks[0])")),
        {RING: "n=10 float64 elements: ring_all_reduce failed on rank"}),
    Wrong("zoo10_ring_direct_exchange", EX, {"ring_all_reduce": """\
def ring_all_reduce(comm, x):
    p, r = comm.world_size, comm.rank
    chunks = x.tensor_split(p)
    sent = [comm.isend(chunks[j], j) for j in range(p) if j != r]  # chunk j to its owner
    for j in range(p):
        if j != r:
            incoming = torch.empty_like(chunks[r])
            comm.recv(incoming, j)
            chunks[r].add_(incoming)
    for request in sent:
        request.wait()
    sent = [comm.isend(chunks[r], j) for j in range(p) if j != r]  # my sum to everyone
    for j in range(p):
        if j != r:
            comm.recv(chunks[j], j)
    for request in sent:
        request.wait()
"""}, {RING: "in a ring every rank sends only to its right neighbour"}),
    # -- 3. sharded_step
    Wrong("zoo10_inf_agreed_but_local_flag_used", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="max"))),
        {INF: "the ranks went separate ways"}),
    Wrong("zoo10_inf_avg_compared_to_one", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="avg") + "    found_inf = flag.item() == 1\n")),
        {INF: "every rank took the step although rank 1's gradients held inf"}),
    Wrong("zoo10_inf_isinf_misses_nan", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="max").replace(
            "not torch.isfinite(g).all()", "bool(torch.isinf(g).any())")
        + "    found_inf = flag.item() > 0\n")),
        {INF: "step 3: every rank took the step although rank 0's gradients held nan"}),
    Wrong("zoo10_inf_returns_nothing", EX, buggy("sharded_step", SOLVED_INF, (
        "        return False\n", "        return\n"), ("    return True\n", "")),
        {INF: "sharded_step returned None, expected True"}),
    Wrong("zoo10_inf_scale_halved_every_step", EX, buggy("sharded_step", SOLVED_INF, (
        "    if found_inf:\n        state[\"scale\"] /= 2\n",
        "    state[\"scale\"] /= 2\n    if found_inf:\n")),
        {INF: "halve the scale on every rank that skips, and only then"}),
    Wrong("zoo10_inf_not_unscaled", EX, buggy("sharded_step", SOLVED_INF, (UNSCALE, "")),
          {INF: "unscale (divide by the scale)"}),
    Wrong("zoo10_inf_broadcast_from_rank0", EX, buggy("sharded_step", (
        LOCAL_FLAG, AGREE.format(op="max").replace(
            'md.all_reduce(comm, flag, op="max")', "md.broadcast(comm, flag, 0)")
        + "    found_inf = flag.item() > 0\n")),
        {INF: "every rank took the step although rank 1's gradients held inf"}),
    # -- 4. train_epochs
    Wrong("zoo10_sampler_set_epoch_zero", EX, buggy("train_epochs", (
        EPOCH_LOOP, EPOCH_LOOP + "        sampler.set_epoch(0)\n")),
        {EPOCHS: "visit the samples in the same order"}),
    Wrong("zoo10_sampler_shuffle_off", EX, buggy("train_epochs", (
        "shuffle=True", "shuffle=False"), (
        EPOCH_LOOP, EPOCH_LOOP + "        sampler.set_epoch(epoch)\n")),
        {EPOCHS: "the samples in the dataset's order: the sampler must shuffle (shuffle=True)"}),
    Wrong("zoo10_sampler_loader_shuffles_everything", EX, buggy("train_epochs", (
        "sampler=sampler)", "shuffle=True)"), (
        EPOCH_LOOP, EPOCH_LOOP + "        sampler.set_epoch(epoch)\n")),
        {EPOCHS: "every epoch it trained on the whole dataset"}),
    Wrong("zoo10_sampler_seed_per_rank", EX, buggy("train_epochs", (
        "seed=0)", "seed=comm.rank)"), (
        EPOCH_LOOP, EPOCH_LOOP + "        sampler.set_epoch(epoch)\n")),
        {EPOCHS: "every rank must pass the same seed"}),
    Wrong("zoo10_sampler_new_sampler_each_epoch", EX, buggy("train_epochs", (
        "    sampler = md.DistributedSampler(dataset, comm, shuffle=True, seed=0)\n"
        "    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)\n"
        + EPOCH_LOOP,
        EPOCH_LOOP + "        sampler = md.DistributedSampler(dataset, comm, seed=0)\n"
        "        loader = torch.utils.data.DataLoader(dataset, batch_size=4, "
        "sampler=sampler)\n")),
        {EPOCHS: "visit the samples in the same order"}),
    Wrong("zoo10_sampler_drop_last", EX, buggy("train_epochs", (
        "seed=0)", "seed=0, drop_last=True)"), (
        EPOCH_LOOP, EPOCH_LOOP + "        sampler.set_epoch(epoch)\n")),
        {EPOCHS: "rank 0 trained on 9 samples, expected 4 per epoch for 3 epochs (12): 11 "
                 "samples on 3 ranks is 3 each, rounded down; the sampler pads"}),
    Wrong("zoo10_sampler_hand_rolled_no_padding", EX, {"train_epochs": """\
def train_epochs(comm, dataset, epochs, train_step):
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(epoch)
        order = torch.randperm(len(dataset), generator=g)[comm.rank::comm.world_size]
        for i in range(0, len(order), 4):
            train_step(dataset[order[i:i + 4]])
"""}, {EPOCHS: "rank 2 trained on 9 samples, expected 4 per epoch for 3 epochs "
                         "(12): 11 samples on 3 ranks is 3 each, rounded down"}),
    # -- 5. zero_sgd_step
    Wrong("zoo10_zero_summed_not_averaged", EX, zero(('op="avg"', 'op="sum"')),
          {ZERO: "moved by 4x the mean gradient"}),
    Wrong("zoo10_zero_params_rebound", EX, zero((
        GATHER, "    params = md.all_gather(comm, mine).flatten()[:n]\n")),
        {ZERO: "it did not move"}),
    Wrong("zoo10_zero_padding_dropped", EX, buggy("zero_sgd_step", (
        "    padded = torch.zeros(shard * p, dtype=grad.dtype)\n    padded[:n] = grad\n", ""), (
        "md.reduce_scatter(comm, padded,", "md.reduce_scatter(comm, grad,")),
        {ZERO: "[8] = 0 (a padding zero; expected -0.826702)"}),
    Wrong("zoo10_zero_own_shard_only", EX, zero((
        "    mine = torch.zeros(shard, dtype=params.dtype)\n"
        "    mine[:end - start] = params[start:end] - lr * g[:end - start]\n" + GATHER,
        "    params[start:end] -= lr * g[:end - start]\n")),
        {ZERO: "it did not move"}),
    Wrong("zoo10_zero_shard_indexes_full_gradient", EX, zero((
        "lr * g[:end - start]", "lr * g[start:end]")),
        {ZERO: "The size of tensor a (3) must match the size of tensor b (0)"}),
    Wrong("zoo10_zero_gathers_the_gradient", EX, zero((
        "    mine = torch.zeros(shard, dtype=params.dtype)\n"
        "    mine[:end - start] = params[start:end] - lr * g[:end - start]\n" + GATHER,
        "    params.sub_(lr * md.all_gather(comm, g).flatten()[:n])\n")),
        {ZERO: "all-gathered its shard of the gradient"}),
    Wrong("zoo10_zero_broadcasts_after_gather", EX, zero((
        GATHER, GATHER + "    md.broadcast(comm, params, 0)\n")),
        {ZERO: "md.broadcast (12 elements): ZeRO's step is exactly one "
                "md.reduce_scatter"}),
    Wrong("zoo10_zero_gathers_whole_params", EX, zero((
        "    mine = torch.zeros(shard, dtype=params.dtype)\n"
        "    mine[:end - start] = params[start:end] - lr * g[:end - start]\n" + GATHER,
        "    params[start:end] -= lr * g[:end - start]\n"
        "    every = md.all_gather(comm, params)\n"
        "    for q in range(p):\n"
        "        params[q * shard:(q + 1) * shard] = every[q, q * shard:(q + 1) * shard]\n")),
        {ZERO: "all-gathered 12 elements, not its shard's 3"}),
    # -- 6. fp16_step
    Wrong("zoo10_fp16_scale_overflows", EX, buggy("fp16_step", (
        BACKWARD, "    (loss * 2.0 ** 40).backward()\n"), (
        TO_FLOAT, "        w.grad = p.grad.float() / 2.0 ** 40\n")),
        {FP16: "the scaled float16 gradients overflowed to inf"}),
    Wrong("zoo10_fp16_unscaled_after_the_step", EX, buggy("fp16_step", SCALED, (
        "    optimizer.step()\n",
        "    optimizer.step()\n    for w in masters:\n        w.grad /= 2.0 ** 16\n")),
        {FP16: "the gradients still hold the scale"}),
    Wrong("zoo10_fp16_summed_over_ranks", EX, buggy("fp16_step", SCALED, UNSCALED, (
        'md.all_reduce(comm, w.grad, op="avg")', 'md.all_reduce(comm, w.grad, op="sum")')),
        {FP16: 'the gradients were summed over the ranks, not averaged'}),
    Wrong("zoo10_fp16_not_averaged", EX, buggy("fp16_step", SCALED, UNSCALED, (
        '        md.all_reduce(comm, w.grad, op="avg")\n', "")),
        {FP16: "the ranks' gradients were not averaged"}),
    Wrong("zoo10_fp16_grads_accumulate", EX, buggy("fp16_step", SCALED, UNSCALED, (
        "        p.grad = None\n", "")),
        {FP16: "(backward accumulates into .grad): clear them (p.grad = None)"}),
    Wrong("zoo10_fp16_scale_too_small", EX, buggy("fp16_step", (
        BACKWARD, "    (loss * 2.0).backward()\n"), (
        TO_FLOAT, "        w.grad = p.grad.float() / 2.0\n")),
        {FP16: "underflowed"}),
    # -- 7. pipeline_1f1b
    Wrong("zoo10_pipe_one_at_a_time", EX, buggy("pipeline_1f1b", (
        WARMUP, "    warmup = 0\n")),
        {PIPE: "the loss and gradients are right, but stage 0 ran F B F B F B"}),
    Wrong("zoo10_pipe_warmup_off_by_one", EX, buggy("pipeline_1f1b", (
        WARMUP, "    warmup = min(p - r, m)\n")),
        {PIPE: "at most min(p - r, m)"}),
    Wrong("zoo10_pipe_warmup_by_rank", EX, buggy("pipeline_1f1b", (
        WARMUP, "    warmup = min(r, m)\n")),
        {PIPE: "the schedule deadlocks"}),
    Wrong("zoo10_pipe_pops_newest", EX, buggy("pipeline_1f1b", CAPPED, (
        "kept.pop(0)", "kept.pop()")),
        {PIPE: "stage 0's weight gradient is"}),
    Wrong("zoo10_pipe_loss_of_last_micro_batch", EX, buggy("pipeline_1f1b", CAPPED, (
        "            total += y.item()\n", "            total = y.item()\n")),
        {PIPE: "(the sum over the micro-batches)"}),
    Wrong("zoo10_pipe_steady_state_capped_only", EX, buggy("pipeline_1f1b", (
        "    for i in range(warmup, m):", "    for i in range(min(warmup, m), m):")),
        {PIPE: "the schedule deadlocks at m=2"}),
]
