"""Wrong (and rightly different) answers to exercise 02's bucket stages: buckets reduced
in order as soon as they are ready, and (the stretch) on a worker thread."""

from . import Wrong

EX = "02_data_parallel"
END_OF_BACKWARD = "torch.autograd.Variable._execution_engine.queue_callback"
STAGE_B, STAGE_C = "test_register_bucket_hooks", "test_register_overlapped_hooks"
HELPER = """\
def all_reduce_bucket(comm, grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    md.all_reduce(comm, flat, op="avg")
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


"""
COUNT = """\
    params = list(model.parameters())
    bucket_of = {i: k for k, bucket in enumerate(buckets) for i in bucket}
    waiting = [len(bucket) for bucket in buckets]
    state = {"next": 0, "armed": False, "futures": []}
"""
IN_ORDER = """\
        while state["next"] < len(buckets) and waiting[state["next"]] == 0:
            k = state["next"]
            REDUCE
            waiting[k], state["next"] = len(buckets[k]), (k + 1) % len(buckets)
"""
HOOK_EVERY = """\
    for i in bucket_of:
        params[i].register_post_accumulate_grad_hook(lambda param, i=i: on_gradient(i))
"""


def bucket_hooks(body: str, helper: str = HELPER) -> dict:
    return {"register_bucket_hooks":
            helper + "def register_bucket_hooks(model, comm, buckets):\n" + body}


def in_order(reduce: str) -> str:
    """A hook that reduces every ready bucket in order with ``reduce`` (a statement that may
    use k, the bucket's index), then the registration."""
    return (COUNT + "\n    def on_gradient(i):\n        waiting[bucket_of[i]] -= 1\n"
            + IN_ORDER.replace("REDUCE", reduce) + HOOK_EVERY)


def overlapped(body: str) -> dict:
    return {"register_overlapped_hooks":
            "def register_overlapped_hooks(model, comm, buckets):\n" + body}


REDUCE_NOW = "all_reduce_bucket(comm, [params[j].grad for j in buckets[k]])"


WRONG = [
    Wrong("bucket_per_parameter", EX, bucket_hooks(in_order(
        "[md.all_reduce(comm, params[j].grad, op='avg') for j in buckets[k]]")),
        {STAGE_B: "one all-reduce per parameter. Flatten"}),
    Wrong("bucket_when_ready_in_any_order", EX, bucket_hooks(COUNT + """\

    def on_gradient(i):
        k = bucket_of[i]
        waiting[k] -= 1
        if waiting[k] == 0:
            all_reduce_bucket(comm, [params[j].grad for j in buckets[k]])
            waiting[k] = len(buckets[k])
""" + HOOK_EVERY), {STAGE_B: "the right buckets in the wrong order"}),
    Wrong("bucket_at_end_of_backward", EX, bucket_hooks(COUNT + f"""\

    def reduce_all():
        state["armed"] = False
        for bucket in buckets:
            all_reduce_bucket(comm, [params[j].grad for j in bucket])

    def on_gradient(i):
        if not state["armed"]:
            state["armed"] = True
            {END_OF_BACKWARD}(reduce_all)
""" + HOOK_EVERY), {STAGE_B: "start each bucket's all-reduce as soon as its last gradient"}),
    Wrong("bucket_state_never_reset", EX, bucket_hooks(in_order(REDUCE_NOW).replace(
        "waiting[k], state[\"next\"] = len(buckets[k]), (k + 1) % len(buckets)",
        "state[\"next\"] = k + 1")), {STAGE_B: "backward pass 2"}),
    Wrong("bucket_not_copied_back", EX, bucket_hooks(in_order(REDUCE_NOW), helper="""\
def all_reduce_bucket(comm, grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    md.all_reduce(comm, flat, op="avg")


"""), {STAGE_B: "not copied back into .grad", STAGE_C: "not copied back into .grad"}),
    Wrong("bucket_coalesced", EX, bucket_hooks(in_order(
        "md.all_reduce_coalesced(comm, [params[j].grad for j in buckets[k]], op='avg')")),
        {STAGE_B: "minidist.collectives.api.all_reduce_coalesced is not allowed"}),
    Wrong("bucket_scheduler", EX, bucket_hooks("""\
    from minidist.parallel.data.scheduler import BucketScheduler
    BucketScheduler(comm, list(model.named_parameters()), 10_000)
"""), {STAGE_B: "minidist.parallel.data.scheduler.BucketScheduler is not allowed"}),
    Wrong("overlap_on_backward_thread", EX, overlapped(in_order(REDUCE_NOW)),
          {STAGE_C: "the all-reduces ran on the thread that runs backward"}),
    Wrong("overlap_hook_waits", EX, overlapped(
        "    worker = ThreadPoolExecutor(max_workers=1)\n" + in_order(
            "worker.submit(all_reduce_bucket, comm, [params[j].grad for j in buckets[k]])"
            ".result()")), {STAGE_C: "backward stopped while the thread reduced the first"}),
    Wrong("overlap_never_waits", EX, overlapped(
        "    worker = ThreadPoolExecutor(max_workers=1)\n" + in_order(
            "worker.submit(all_reduce_bucket, comm, [params[j].grad for j in buckets[k]])")),
        {STAGE_C: "the thread had not reduced its bucket yet"}),
    Wrong("overlap_thread_after_backward", EX, overlapped(COUNT + f"""\
    worker = ThreadPoolExecutor(max_workers=1)

    def reduce_all():
        state["armed"] = False
        for f in [worker.submit(all_reduce_bucket, comm, [params[j].grad for j in bucket])
                  for bucket in buckets]:
            f.result()

    def on_gradient(i):
        if not state["armed"]:
            state["armed"] = True
            {END_OF_BACKWARD}(reduce_all)
""" + HOOK_EVERY), {STAGE_C: "the first all-reduce started only once backward had computed"}),
    Wrong("overlap_comm_thread", EX, overlapped("""\
    from minidist.parallel.data.scheduler import CommThread
    CommThread().submit(lambda: None)
"""), {STAGE_C: "minidist.parallel.data.scheduler.CommThread is not allowed"}),
    Wrong("overlap_daemon_thread_and_queue", EX, overlapped(COUNT + f"""\
    import queue
    import threading
    work, done = queue.Queue(), queue.Queue()

    def serve():
        while True:
            grads = work.get()
            all_reduce_bucket(comm, grads)
            done.put(None)

    threading.Thread(target=serve, daemon=True).start()

    def wait_for_all():
        for _ in buckets:
            done.get()
        state["armed"] = False

    def on_gradient(i):
        if not state["armed"]:
            state["armed"] = True
            {END_OF_BACKWARD}(wait_for_all)
        waiting[bucket_of[i]] -= 1
""" + IN_ORDER.replace("REDUCE", "work.put([params[j].grad for j in buckets[k]])")
        + HOOK_EVERY), passes=True),
]

# -- more wrong answers (issue 27: ten per graded test) -------------------------------------------
WAIT_AT_END = f"""\
    def wait_for_buckets():
        in_flight = state["futures"]
        state.update(next=0, futures=[], armed=False)
        for f in in_flight:
            f.join() if hasattr(f, "join") else f.result()

    def arm():
        if not state["armed"]:
            state["armed"] = True
            {END_OF_BACKWARD}(wait_for_buckets)
"""


def overlapped_with(reduce: str, wait: str = WAIT_AT_END, pre: str = "",
                    steady: str = IN_ORDER) -> dict:
    """A worker-thread version: ``reduce`` hands bucket k over (and appends what to wait for
    to state["futures"]), ``wait`` defines arm(), called by every hook first."""
    return overlapped(COUNT + pre + wait + "\n    def on_gradient(i):\n        arm()\n"
                      "        waiting[bucket_of[i]] -= 1\n"
                      + steady.replace("REDUCE", reduce) + HOOK_EVERY)


SUBMIT = ("state[\"futures\"].append(worker.submit(all_reduce_bucket, comm, "
          "[params[j].grad for j in buckets[k]]))")
POOL = "    worker = ThreadPoolExecutor(max_workers=1)\n"
WRONG += [
    Wrong("bucket_summed", EX, bucket_hooks(in_order(REDUCE_NOW), helper=HELPER.replace(
        'op="avg"', 'op="sum"')), {STAGE_B: "times too large: you summed the gradients",
                                 STAGE_C: "times too large: you summed the gradients"}),
    Wrong("bucket_copy_back_from_the_start", EX, bucket_hooks(in_order(REDUCE_NOW), helper="""\
def all_reduce_bucket(comm, grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    md.all_reduce(comm, flat, op="avg")
    for g in grads:
        g.copy_(flat[: g.numel()].view_as(g))


"""), {STAGE_B: "copied back from the wrong part of the bucket",
       STAGE_C: "copied back from the wrong part of the bucket"}),
    Wrong("bucket_everything_at_once", EX, bucket_hooks(COUNT + """\
    left = [sum(waiting)]

    def on_gradient(i):
        left[0] -= 1
        if left[0] == 0:
            all_reduce_bucket(comm, [params[j].grad for b in buckets for j in b])
            left[0] = sum(len(b) for b in buckets)
""" + HOOK_EVERY), {STAGE_B: "one all-reduce of every gradient at once"}),
    Wrong("bucket_last_bucket_first", EX, bucket_hooks(COUNT + """\

    def on_gradient(i):
        waiting[bucket_of[i]] -= 1
        last = len(buckets) - 1
        while state["next"] < len(buckets) and waiting[last - state["next"]] == 0:
            k = last - state["next"]
            all_reduce_bucket(comm, [params[j].grad for j in buckets[k]])
            waiting[k], state["next"] = len(buckets[k]), (state["next"] + 1) % len(buckets)
""" + HOOK_EVERY), {STAGE_B: "the right buckets in the wrong order. Reduce bucket 0 first"}),
    Wrong("overlap_thread_per_bucket", EX, overlapped_with(
        "t = threading.Thread(target=all_reduce_bucket, args=(comm, [params[j].grad for j in "
        "buckets[k]]))\n            t.start()\n            state[\"futures\"].append(t)",
        pre="    import threading\n"), {STAGE_C: "use one worker thread"}),
    Wrong("overlap_state_not_reset", EX, overlapped_with(SUBMIT, WAIT_AT_END.replace(
        "next=0, ", ""), POOL, IN_ORDER.replace("(k + 1) % len(buckets)", "k + 1")),
        {STAGE_C: "must start afresh for the next"}),
    Wrong("overlap_callback_at_registration", EX, overlapped_with(SUBMIT, WAIT_AT_END.replace(
        "    def arm():", f"    {END_OF_BACKWARD}(wait_for_buckets)\n\n    def arm():"), POOL),
        {STAGE_C: "Final callbacks can only be installed during backward pass"}),
    Wrong("overlap_waits_at_next_pass", EX, overlapped_with(
        SUBMIT + "\n            state[\"armed\"] = k < len(buckets) - 1", """\
    def arm():  # the first hook of a pass waits for the last pass's buckets
        if not state["armed"]:
            state["armed"] = True
            for f in state["futures"]:
                f.result()
            state["futures"] = []
""", POOL), {STAGE_C: "the thread had not reduced its bucket yet"}),
    Wrong("overlap_any_order", EX, overlapped(COUNT + POOL + WAIT_AT_END + """\

    def on_gradient(i):
        arm()
        k = bucket_of[i]
        waiting[k] -= 1
        if waiting[k] == 0:
            waiting[k] = len(buckets[k])
            state["futures"].append(worker.submit(
                all_reduce_bucket, comm, [params[j].grad for j in buckets[k]]))
""" + HOOK_EVERY), {STAGE_C: "the right buckets in the wrong order"}),
]
