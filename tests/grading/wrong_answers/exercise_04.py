"""Wrong (and rightly different) answers to exercise 04: the 1F1B list, a stage's forward and
backward, and the stretch's whole step."""

from . import Wrong

EX = "04_pipeline_parallel"
SCHED, FWD, BWD, STEP = ("test_one_f_one_b", "test_forward_step", "test_backward_step",
                         "test_pipeline_step")
STEADY = """\
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [("F", i), ("B", i - warmup)]
    return actions + [("B", i) for i in range(microbatches - warmup, microbatches)]
"""


def schedule(body: str) -> dict:
    return {"one_f_one_b": "def one_f_one_b(rank, stages, microbatches):\n" + body}


def forward(body: str) -> dict:
    return {"forward_step": "def forward_step(comm, module, x, pending):\n"
                            "    r, p = comm.rank, comm.world_size\n" + body}


def backward(body: str) -> dict:
    return {"backward_step": "def backward_step(comm, inp, out, pending):\n"
                             "    r, p = comm.rank, comm.world_size\n" + body}


RECEIVE = """\
    if r > 0:
        comm.recv(x, r - 1)
        x.requires_grad_()
"""
BACKWARD = """\
    if r < p - 1:
        grad = torch.empty_like(out)
        comm.recv(grad, r + 1)
        out.backward(grad)
    else:
        out.backward()
"""


def step(loss: str, loop: str = "    for kind, i in actions:\n") -> dict:
    return {"pipeline_step": f"""\
def pipeline_step(comm, module, actions, microbatches, x, y, loss_fn):
    r, p, n = comm.rank, comm.world_size, len(x)
    xs = x.tensor_split(microbatches)
    ys = y.tensor_split(microbatches) if r == p - 1 else None
    pending, kept, total = [], {{}}, 0.0
{loop}\
        if kind == "F":
            inp, out = forward_step(comm, module, xs[i], pending)
            if r == p - 1:
                out = {loss}
                total += out.item()
            kept[i] = (inp, out)
        else:
            backward_step(comm, *kept.pop(i), pending)
    for request in pending:
        request.wait()
    return total if r == p - 1 else None
"""}


WRONG = [
    Wrong("sched_gpipe", EX, schedule("""\
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
"""), {SCHED: "stage 0 holds 5 micro-batches in flight at its list[4]"}),
    Wrong("sched_warmup_off_by_one", EX, schedule(
        "    warmup = min(stages - rank, microbatches)\n" + STEADY),
        {SCHED: "where the bound is p - r = 4: it runs 5 forwards before its first backward"}),
    Wrong("sched_warmup_by_rank", EX, schedule(
        "    warmup = min(rank, microbatches)\n" + STEADY),
        {SCHED: "deadlock between stages 0 and 1: stage 0 waits at its list[1] = ('B', 0)"}),
    Wrong("sched_backward_first", EX, schedule("""\
    warmup = min(stages - rank - 1, microbatches)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [("B", i - warmup), ("F", i)]
    return actions + [("B", i) for i in range(microbatches - warmup, microbatches)]
"""), {SCHED: "micro-batch 0 backwarded before its forward on stage 3"}),
    Wrong("sched_warmup_ignores_m", EX, schedule(
        "    warmup = stages - rank - 1\n" + STEADY),
        {SCHED: "but there are 2 micro-batches, numbered 0 to 1"}),
    Wrong("sched_one_at_a_time", EX, schedule("""\
    return [a for i in range(microbatches) for a in (("F", i), ("B", i))]
"""), {SCHED: "stage 0 runs 1 forward before its first backward, where 1F1B runs 4"}),
    Wrong("sched_cool_down_newest_first", EX, schedule("""\
    warmup = min(stages - rank - 1, microbatches)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [("F", i), ("B", i - warmup)]
    return actions + [("B", i) for i in reversed(range(microbatches - warmup, microbatches))]
"""), {SCHED: "so every stage must backward in the same order"}),
    Wrong("sched_library", EX, schedule("""\
    return md.pipeline.actions("1f1b", stages, microbatches)[rank]
"""), {SCHED: "minidist.parallel.pipeline.schedules.actions is not allowed in this exercise"}),
    Wrong("sched_lists_not_tuples", EX, schedule("""\
    warmup = min(stages - rank - 1, microbatches)
    actions = [["F", i] for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [["F", i], ["B", i - warmup]]
    return actions + [["B", i] for i in range(microbatches - warmup, microbatches)]
"""), passes=True),
    Wrong("fwd_blocking_send", EX, forward(RECEIVE + """\
    out = module(x)
    if r < p - 1:
        comm.send(out.detach(), r + 1)
    return x, out
"""), {FWD: "forward_step sends with comm.send, which returns only once rank 1 has received"}),
    Wrong("fwd_no_requires_grad", EX, forward("""\
    if r > 0:
        comm.recv(x, r - 1)
    out = module(x)
    if r < p - 1:
        pending.append(comm.isend(out.detach(), r + 1))
    return x, out
"""), {FWD: "the input forward_step returned does not require a gradient",
       STEP: "TypeError"}),
    Wrong("fwd_sends_around_the_ring", EX, forward(RECEIVE + """\
    out = module(x)
    pending.append(comm.isend(out.detach(), (r + 1) % p))
    return x, out
"""), {FWD: "forward_step sends to rank 0, but the last stage sends nothing forward",
       STEP: "MessageMismatchError"}),
    Wrong("fwd_module_before_receive", EX, forward("""\
    if r > 0:
        request = comm.irecv(x, r - 1)
        x.requires_grad_()
    out = module(x)
    if r > 0:
        request.wait()
    if r < p - 1:
        pending.append(comm.isend(out.detach(), r + 1))
    return x, out
"""), {FWD: "did the module run before the activation had arrived",
       STEP: "but the batch's loss is"}),
    Wrong("fwd_pipeline_stage", EX, forward("""\
    stage = md.PipelineStage(module, comm)
    return stage.forward_one_chunk(x)
"""), {FWD: "is not allowed in this exercise", STEP: "is not allowed in this exercise"}),
    Wrong("bwd_wrong_neighbour", EX, backward(BACKWARD + """\
    if r > 0:
        pending.append(comm.isend(inp.grad, (r + 1) % p))
"""), {BWD: "the gradient of this stage's input goes back to the previous stage",
     STEP: "deadlock"}),
    Wrong("bwd_passes_the_received_gradient", EX, backward("""\
    grad = None
    if r < p - 1:
        grad = torch.empty_like(out)
        comm.recv(grad, r + 1)
        out.backward(grad)
    else:
        out.backward()
    if r > 0:
        pending.append(comm.isend(inp.grad if grad is None else grad, r - 1))
"""), {BWD: "the gradient sent back is the gradient of the stage's output, as received",
       STEP: "values wrong"}),
    Wrong("bwd_sends_out_grad", EX, backward(BACKWARD + """\
    if r > 0:
        pending.append(comm.isend(out.grad, r - 1))
"""), {BWD: "autograd keeps .grad only on leaf tensors such as inp",
       STEP: "pipeline_step failed on rank"}),
    Wrong("bwd_never_sends", EX, backward(BACKWARD),
          {BWD: "backward_step returned without sending the gradient of its input to rank 0",
           STEP: "deadlock"}),
    Wrong("step_mean_of_losses", EX, step("loss_fn(out, ys[i]) / microbatches"),
          {STEP: "each micro-batch's loss weighted 1/m"}),
    Wrong("step_sum_of_losses", EX, step("loss_fn(out, ys[i])"),
          {STEP: "the sum of the micro-batches' losses"}),
    Wrong("step_always_gpipe", EX, step(
        "loss_fn(out, ys[i]) * (len(xs[i]) / n)",
        "    for kind, i in [(k, j) for k in 'FB' for j in range(microbatches)]:\n"),
        {STEP: "run them in their order"}),
]

# -- more wrong answers (issue 27: ten per graded test) -------------------------------------------
SEND = """\
    if r < p - 1:
        pending.append(comm.isend(out.detach(), r + 1))
    return x, out
"""
SEND_BACK = """\
    if r > 0:
        pending.append(comm.isend(inp.grad, r - 1))
"""
WRONG += [
    Wrong("sched_warmup_ignores_rank", EX, schedule(
        "    warmup = min(stages - 1, microbatches)\n" + STEADY),
        {SCHED: "where the bound is p - r = 3"}),
    Wrong("sched_steady_newest_backward", EX, schedule("""\
    warmup = min(stages - rank - 1, microbatches)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [("F", i), ("B", i)]
    return actions + [("B", i) for i in range(warmup)]
"""), {SCHED: "so every stage must backward in the same order"}),
    Wrong("sched_strings", EX, schedule("""\
    warmup = min(stages - rank - 1, microbatches)
    actions = [f"F{i}" for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [f"F{i}", f"B{i - warmup}"]
    return actions + [f"B{i}" for i in range(microbatches - warmup, microbatches)]
"""), {SCHED: "each action is a pair ('F', i) or ('B', i)"}),
    Wrong("fwd_recv_from_next", EX, forward("""\
    if r > 0:
        comm.recv(x, (r + 1) % p)
        x.requires_grad_()
    out = module(x)
""" + SEND), {FWD: "the activation comes from the previous stage",
      STEP: "waits in `comm.recv(x, (r + 1) % p)`"}),
    Wrong("fwd_recv_any_source", EX, forward("""\
    if r > 0:
        comm.recv(x)
        x.requires_grad_()
    out = module(x)
""" + SEND), {FWD: "from md.ANY_SOURCE (-1): the activation comes from the previous stage",
      STEP: "pipeline_step receives from md.ANY_SOURCE (-1)"}),
    Wrong("fwd_stage0_receives", EX, forward("""\
    comm.recv(x, r - 1)
    x.requires_grad_()
    out = module(x)
""" + SEND), {FWD: "stage 0 receives nothing: its x is the micro-batch itself",
      STEP: "pipeline_step receives from md.ANY_SOURCE (-1)"}),
    Wrong("fwd_returns_out_only", EX, forward(RECEIVE + """\
    out = module(x)
    if r < p - 1:
        pending.append(comm.isend(out.detach(), r + 1))
    return out
"""), {FWD: "expected (inp, out)", STEP: "too many values to unpack"}),
    Wrong("fwd_under_no_grad", EX, forward(RECEIVE + """\
    with torch.no_grad():
        out = module(x)
""" + SEND), {FWD: "is not part of autograd's graph", STEP: "does not require grad"}),
    Wrong("fwd_request_not_kept", EX, forward(RECEIVE + """\
    out = module(x)
    if r < p - 1:
        comm.isend(out.detach(), r + 1)
    return x, out
"""), {FWD: "started 1 isend(s) but put 0 request(s) in pending",
      STEP: "never waited for"}),
    Wrong("fwd_sends_its_input", EX, forward(RECEIVE + """\
    out = module(x)
    if r < p - 1:
        pending.append(comm.isend(x.detach(), r + 1))
    return x, out
"""), {FWD: "is not the activation stage 0 computed",
      STEP: "but the batch's loss is"}),
    Wrong("fwd_sends_twice", EX, forward(RECEIVE + """\
    out = module(x)
    if r < p - 1:
        pending.append(comm.isend(out.detach(), r + 1))
        pending.append(comm.isend(out.detach(), r + 1))
    return x, out
"""), {FWD: "sent 2 messages to rank 1: send its output once, one message per micro-batch",
      STEP: "MessageMismatchError"}),
    Wrong("bwd_recv_from_previous", EX, backward("""\
    if r < p - 1:
        grad = torch.empty_like(out)
        comm.recv(grad, r - 1)
        out.backward(grad)
    else:
        out.backward()
""" + SEND_BACK), {BWD: "the gradient of this stage's output comes from the next stage",
      STEP: "pipeline_step receives from md.ANY_SOURCE (-1)"}),
    Wrong("bwd_blocking_send", EX, backward(BACKWARD + """\
    if r > 0:
        comm.send(inp.grad, r - 1)
"""), {BWD: "backward_step sends with comm.send, which returns only once rank"}),
    Wrong("bwd_last_stage_receives", EX, backward("""\
    grad = torch.empty_like(out)
    comm.recv(grad, r + 1)
    out.backward(grad)
""" + SEND_BACK), {BWD: "the last stage receives no gradient",
      STEP: "src=2 is outside the communicator"}),
    Wrong("bwd_request_not_kept", EX, backward(BACKWARD + """\
    if r > 0:
        comm.isend(inp.grad, r - 1)
"""), {BWD: "started 1 isend(s) but put 0 request(s) in pending",
      STEP: "never waited for"}),
    Wrong("bwd_sends_before_backward", EX, backward("""\
    if r > 0:
        pending.append(comm.isend(inp.grad, r - 1))
""" + BACKWARD), {BWD: "the gradient to send back is inp.grad, which backward fills in",
      STEP: "got NoneType"}),
    Wrong("bwd_stage0_sends", EX, backward(BACKWARD + """\
    pending.append(comm.isend(inp.grad, r - 1))
"""), {BWD: "stage 0 sends no gradient back: no stage comes before it",
      STEP: "got NoneType"}),
    Wrong("bwd_frees_grad_before_sent", EX, backward(BACKWARD + SEND_BACK + """\
    if r > 0:
        inp.grad.zero_()
"""), {BWD: "changed the gradient it sent before the send completed"}),
    Wrong("bwd_float32_buffer", EX, backward("""\
    if r < p - 1:
        grad = torch.zeros(out.shape)
        comm.recv(grad, r + 1)
        out.backward(grad)
    else:
        out.backward()
""" + SEND_BACK), {BWD: "sender and receiver must use the same dtype", STEP: "float32"}),
]
