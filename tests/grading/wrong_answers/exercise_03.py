"""Wrong (and rightly different) answers to exercise 03."""

from . import Wrong

EX = "03_parameter_server"
SYNC, ADMITS, SERVE = "test_sync_step", "test_ssp_admits", "test_ssp_serve"
RECEIVE_ALL = """\
    workers = comm.world_size - 1
    total, grad = torch.zeros_like(params), torch.empty_like(params)
    for _ in range(workers):
        comm.recv(grad, md.ANY_SOURCE)
        total += grad
"""
REPLY_ALL = """\
    for w in range(1, comm.world_size):
        comm.send(params, w)
"""
SERVE_HEAD = """\
    clocks = {w: 0 for w in range(1, comm.world_size)}
    held, grad = [], torch.empty_like(params)
    for _ in range(steps * len(clocks)):
        w = comm.recv(grad, md.ANY_SOURCE)
"""
RELEASE = """\
        for v in list(held):
            if admits(clocks[v], list(clocks.values()), staleness):
                held.remove(v)
                comm.send(params, v)
"""


def sync(body: str) -> dict:
    return {"sync_step": "def sync_step(comm, params, lr):\n" + body}


def admits(body: str) -> dict:
    return {"ssp_admits": "def ssp_admits(clock, clocks, staleness):\n" + body}


def serve(body: str) -> dict:
    return {"ssp_serve":
            "def ssp_serve(comm, params, lr, staleness, steps, admits):\n" + body}


WRONG = [
    # -- sync_step ----------------------------------------------------------------------------
    Wrong("sync_average_over_world_size", EX, sync(RECEIVE_ALL + """\
    params -= lr * total / comm.world_size
""" + REPLY_ALL), {SYNC: "averaged over world_size = 3, but only the 2 workers"}),
    Wrong("sync_sum_not_average", EX, sync(RECEIVE_ALL + """\
    params -= lr * total
""" + REPLY_ALL), {SYNC: "the sum of the 2 gradients, 2 times the average"}),
    Wrong("sync_by_rank_not_any_source", EX, sync("""\
    total, grad = torch.zeros_like(params), torch.empty_like(params)
    for w in range(1, comm.world_size):
        comm.recv(grad, w)
        total += grad
    params -= lr * total / (comm.world_size - 1)
""" + REPLY_ALL), {SYNC: "received from rank 1 by name (src=1)"}),
    Wrong("sync_reply_as_they_come", EX, sync("""\
    workers = comm.world_size - 1
    total, grad = torch.zeros_like(params), torch.empty_like(params)
    for _ in range(workers):
        w = comm.recv(grad, md.ANY_SOURCE)
        total += grad
        comm.send(params, w)
    params -= lr * total / workers
"""), {SYNC: "when only 1 of the 2 gradients had arrived"}),
    Wrong("sync_answered_twice", EX, sync(RECEIVE_ALL + """\
    params -= lr * total / workers
    for w in range(1, comm.world_size):
        comm.send(params, w)
        comm.send(params, w)
"""), {SYNC: "worker 1 was answered twice for its push of step 1"}),
    Wrong("sync_one_worker_never_answered", EX, sync(RECEIVE_ALL + """\
    params -= lr * total / workers
    for w in range(1, comm.world_size - 1):
        comm.send(params, w)
"""), {SYNC: "without answering worker 2, which now waits forever"}),
    Wrong("sync_reply_to_the_server_too", EX, sync(RECEIVE_ALL + """\
    params -= lr * total / workers
    for w in range(comm.world_size):
        comm.send(params, w)
"""), {SYNC: "sent a message to rank 0, which is not a worker"}),
    Wrong("sync_receives_world_size_times", EX, sync(RECEIVE_ALL.replace(
        "for _ in range(workers)", "for _ in range(comm.world_size)") + """\
    params -= lr * total / workers
""" + REPLY_ALL), {SYNC: "waits for a gradient that no worker will send"}),
    Wrong("sync_one_buffer_for_all", EX, sync("""\
    workers = comm.world_size - 1
    grad, grads = torch.empty_like(params), []
    for _ in range(workers):
        comm.recv(grad, md.ANY_SOURCE)
        grads.append(grad)
    params -= lr * torch.stack(grads).mean(0)
""" + REPLY_ALL), {SYNC: "did one receive buffer overwrite another"}),
    Wrong("sync_not_in_place", EX, sync(RECEIVE_ALL + """\
    params = params - lr * total / workers
""" + REPLY_ALL), {SYNC: "update params in place"}),
    Wrong("sync_reply_before_update", EX, sync(RECEIVE_ALL + REPLY_ALL + """\
    params -= lr * total / workers
"""), {SYNC: "they are the parameters before the update"}),
    Wrong("sync_library_average", EX, sync("""\
    from minidist.parallel.param_server.rules import average
    grads = []
    for _ in range(comm.world_size - 1):
        grads.append(torch.empty_like(params))
        comm.recv(grads[-1], md.ANY_SOURCE)
    params -= lr * average(grads)
""" + REPLY_ALL), {SYNC: "minidist.parallel.param_server.rules.average is not allowed"}),
    Wrong("sync_collective_broadcast", EX, sync("""\
    md.broadcast(comm, params, src=0)
"""), {SYNC: "is not allowed in this exercise"}),
    Wrong("sync_posted_receives", EX, sync("""\
    bufs = [torch.empty_like(params) for _ in range(comm.world_size - 1)]
    requests = [comm.irecv(b, md.ANY_SOURCE) for b in bufs]
    senders = [r.wait() for r in requests]
    params.sub_(lr * torch.stack(bufs).mean(0))
    for w in senders:
        comm.send(params, w)
"""), passes=True),
    # -- ssp_admits ---------------------------------------------------------------------------
    Wrong("admits_strict_bound", EX, admits("    return clock - min(clocks) < staleness\n"),
          {ADMITS: "the bound is inclusive"}),
    Wrong("admits_one_too_many", EX, admits("    return clock - min(clocks) <= staleness + 1\n"),
          {ADMITS: "admits a worker s + 1 steps ahead, one more than the bound"}),
    Wrong("admits_against_the_fastest", EX, admits(
        "    return max(clocks) - clock <= staleness\n"),
        {ADMITS: "ahead of the slowest: c - min(clocks) <= s"}),
    Wrong("admits_library_rule", EX, admits("""\
    from minidist.parallel.param_server.rules import ssp_admits as theirs
    return theirs(clock, min(clocks), staleness)
"""), {ADMITS: "minidist.parallel.param_server.rules.ssp_admits is not allowed"}),
    Wrong("admits_numpy_bool", EX, admits("""\
    import numpy as np
    return np.int64(clock) - np.min(clocks) <= staleness
"""), passes=True),
    # -- ssp_serve ----------------------------------------------------------------------------
    Wrong("serve_releases_only_the_pusher", EX, serve(SERVE_HEAD + """\
        params -= lr * grad
        clocks[w] += 1
        if admits(clocks[w], list(clocks.values()), staleness):
            comm.send(params, w)
"""), {SERVE: "not only to the one that pushed"}),
    Wrong("serve_rule_before_the_clock", EX, serve(SERVE_HEAD + """\
        params -= lr * grad
        held.append(w)
""" + RELEASE + """\
        clocks[w] += 1
"""), {SERVE: "more than s = 0"}),
    Wrong("serve_averages_the_push", EX, serve(SERVE_HEAD + """\
        params -= lr * grad / len(clocks)
        clocks[w] += 1
        held.append(w)
""" + RELEASE), {SERVE: "each push was divided by 2"}),
    Wrong("serve_replies_before_applying", EX, serve(SERVE_HEAD + """\
        clocks[w] += 1
        held.append(w)
""" + RELEASE + """\
        params -= lr * grad
"""), {SERVE: "apply each push (params -= lr * grad) as soon as it arrives"}),
    Wrong("serve_never_stops", EX, serve(SERVE_HEAD.replace(
        "for _ in range(steps * len(clocks))", "while True") + """\
        params -= lr * grad
        clocks[w] += 1
        held.append(w)
""" + RELEASE), {SERVE: "waits for a push that can never come"}),
    Wrong("serve_stops_early", EX, serve(SERVE_HEAD.replace(
        "range(steps * len(clocks))", "range(steps)") + """\
        params -= lr * grad
        clocks[w] += 1
        held.append(w)
""" + RELEASE), {SERVE: "ssp_serve returned when worker"}),
    Wrong("serve_without_the_rule", EX, serve(SERVE_HEAD + """\
        params -= lr * grad
        clocks[w] += 1
        comm.send(params, w)
"""), {SERVE: "more than s = 0"}),
    Wrong("serve_receives_in_turn", EX, serve("""\
    clocks = {w: 0 for w in range(1, comm.world_size)}
    held, grad = [], torch.empty_like(params)
    for k in range(steps * len(clocks)):
        w = 1 + k % len(clocks)  # each worker in turn
        comm.recv(grad, w)
        params -= lr * grad
        clocks[w] += 1
        held.append(w)
""" + RELEASE), {SERVE: "the server received from rank 1 by name (src=1)"}),
    Wrong("serve_adds_the_push", EX, serve(SERVE_HEAD + """\
        params += lr * grad
        clocks[w] += 1
        held.append(w)
""" + RELEASE), {SERVE: "the update goes against the gradient, params -= lr * grad"}),
    Wrong("serve_replies_with_the_gradient", EX, serve(SERVE_HEAD + """\
        params -= lr * grad
        clocks[w] += 1
        held.append(w)
        for v in list(held):
            if admits(clocks[v], list(clocks.values()), staleness):
                held.remove(v)
                comm.send(grad, v)
"""), {SERVE: "not the parameters: reply with params"}),
    Wrong("serve_removes_while_iterating", EX, serve(SERVE_HEAD + """\
        params -= lr * grad
        clocks[w] += 1
        held.append(w)
        for v in held:  # removing from the list it walks skips the next worker
            if admits(clocks[v], list(clocks.values()), staleness):
                held.remove(v)
                comm.send(params, v)
"""), {SERVE: "walk a copy, list(held)"}),
    Wrong("serve_polls_with_test", EX, serve("""\
    clocks = {w: 0 for w in range(1, comm.world_size)}
    held, grad = set(), torch.empty_like(params)
    while any(c < steps for c in clocks.values()) or held:
        request = comm.irecv(grad, md.ANY_SOURCE)
        while not request.test():
            time.sleep(0.0005)
        w = request.wait()
        params.add_(grad, alpha=-lr)
        clocks[w] += 1
        held.add(w)
        for v in sorted(held):
            if admits(clocks[v], list(clocks.values()), staleness):
                held.discard(v)
                comm.send(params, v)
"""), passes=True),
]
