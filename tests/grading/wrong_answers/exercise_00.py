"""Wrong (and rightly different) answers to exercise 00."""

from . import Wrong

EX = "00_getting_started"


def shift(body: str) -> dict:
    return {"ring_shift": "def ring_shift(comm, t):\n" + body}


def pong(body: str) -> dict:
    return {"ping_pong": "def ping_pong(comm, nbytes, iters):\n" + body}


def fit(body: str) -> dict:
    return {"fit_alpha_beta": "def fit_alpha_beta(sizes, seconds):\n" + body}


def predict(body: str) -> dict:
    return {"predict_transfer_time": "def predict_transfer_time(nbytes, alpha, beta):\n" + body}


PREDICT = "test_predict_transfer_time"
RIGHT = "    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size\n"
PONG_LOOP = """\
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    start = time.perf_counter()
    for _ in range(iters if comm.rank < 2 else 0):
        if comm.rank == 0:
            comm.send(buf, 1)
            comm.recv(buf, 1)
        else:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    elapsed = time.perf_counter() - start
"""

WRONG = [
    Wrong("shift_recv_first", EX, shift(RIGHT + """\
    out = torch.empty_like(t)
    comm.recv(out, left)
    comm.send(t, right)
    return out
"""), {"test_ring_shift": "deadlock in ring_shift at `comm.recv(out, left)`"}),
    Wrong("shift_send_first", EX, shift(RIGHT + """\
    out = torch.empty_like(t)
    comm.send(t, right)
    comm.recv(out, left)
    return out
"""), {"test_ring_shift": "rank 0 waits in send to rank 1; rank 1 waits in send to rank 0"}),
    Wrong("shift_sendrecv", EX, shift(RIGHT + """\
    out = torch.empty_like(t)
    comm.sendrecv(t, right, out, left)
    return out
"""), {"test_ring_shift": "comm.sendrecv is not allowed in this exercise"}),
    Wrong("shift_backwards", EX, shift(RIGHT + """\
    out = torch.empty_like(t)
    req = comm.irecv(out, right)
    comm.send(t, left)
    req.wait()
    return out
"""), {"test_ring_shift": "that is the tensor of rank 1"}),
    Wrong("shift_no_message", EX, shift("    return t.clone()\n"),
          {"test_ring_shift": "rank 0: 1 of 1 values wrong"}),
    Wrong("shift_two_messages", EX, shift(RIGHT + """\
    out = torch.empty_like(t)
    req = comm.irecv(out, left)
    comm.send(t, right)
    req.wait()
    comm.send(t[:0], right, tag=1)
    comm.recv(out[:0], left, tag=1)
    return out
"""), {"test_ring_shift": "a ring shift sends one message"}),
    Wrong("shift_even_odd_as_list", EX, shift(RIGHT + """\
    out = torch.empty_like(t)
    if comm.rank % 2 == 0:
        comm.send(t, right)
        comm.recv(out, left)
    else:
        comm.recv(out, left)
        comm.send(t, right)
    return out.tolist()
"""), passes=True),
    Wrong("pong_no_barrier", EX, pong(PONG_LOOP + """\
    return elapsed / (2 * iters) if comm.rank == 0 else None
"""), {"test_ping_pong": "call comm.barrier() on every rank first"}),
    Wrong("pong_round_trip", EX, pong("    comm.barrier()\n" + PONG_LOOP + """\
    return elapsed / iters if comm.rank == 0 else None
"""), {"test_ping_pong": "that is the round trip"}),
    Wrong("pong_total", EX, pong("    comm.barrier()\n" + PONG_LOOP + """\
    return elapsed / 2 if comm.rank == 0 else None
"""), {"test_ping_pong": "the time of all 5 round trips, halved"}),
    Wrong("pong_barrier_on_two_ranks", EX, pong("""\
    if comm.rank > 1:
        return None
    comm.barrier()
""" + PONG_LOOP + """\
    return elapsed / (2 * iters) if comm.rank == 0 else None
"""), {"test_ping_pong": "not every rank calls comm.barrier()"}),
    Wrong("pong_rank_0_plays_with_everyone", EX, pong("""\
    comm.barrier()
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    start = time.perf_counter()
    for _ in range(iters):
        for peer in range(1, comm.world_size):
            if comm.rank == 0:
                comm.send(buf, peer)
                comm.recv(buf, peer)
            elif comm.rank == peer:
                comm.recv(buf, 0)
                comm.send(buf, 0)
    return (time.perf_counter() - start) / (2 * iters)
"""), {"test_ping_pong": "expected 4 messages of 1000 bytes to rank 1"}),
    Wrong("pong_tensor_result", EX, pong("    comm.barrier()\n" + PONG_LOOP + """\
    return torch.tensor(elapsed / (2 * iters)) if comm.rank == 0 else None
"""), passes=True),
    Wrong("fit_plain_least_squares", EX, fit("""\
    rows = np.stack([np.ones(len(sizes)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, slope), *_ = np.linalg.lstsq(rows, np.asarray(seconds), rcond=None)
    return float(alpha), float(1 / slope)
"""), {"test_fit_alpha_beta": "relative error"}),
    Wrong("fit_swapped", EX, fit("""\
    t = np.asarray(seconds, dtype=float)
    rows = np.stack([np.ones(len(t)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(rows / t[:, None], np.ones(len(t)), rcond=None)
    return float(1 / inv_beta), float(alpha)
"""), {"test_fit_alpha_beta": "alpha and beta are swapped"}),
    Wrong("fit_slope_not_bandwidth", EX, fit("""\
    t = np.asarray(seconds, dtype=float)
    rows = np.stack([np.ones(len(t)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(rows / t[:, None], np.ones(len(t)), rcond=None)
    return float(alpha), float(inv_beta)
"""), {"test_fit_alpha_beta": "the inverse of the fitted slope"}),
    Wrong("fit_array_result", EX, fit("""\
    t = np.asarray(seconds, dtype=float)
    rows = np.stack([np.ones(len(t)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(rows / t[:, None], np.ones(len(t)), rcond=None)
    return np.array([alpha, 1 / inv_beta])
"""), passes=True),
    Wrong("fit_list_result", EX, fit("""\
    t = np.asarray(seconds, dtype=float)
    rows = np.stack([np.ones(len(t)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(rows / t[:, None], np.ones(len(t)), rcond=None)
    return [alpha, 1 / inv_beta]
"""), passes=True),
    Wrong("fit_infinite_loop", EX, fit("    while True:\n        pass\n"),
          {"test_fit_alpha_beta": "did not return within 6 s: is there an infinite loop?"},
          timeout=6.0),
    Wrong("fit_reads_the_answer_key", EX, fit("""\
    from minidist.grading.exercises.ex00_getting_started.ranks import FIT_CASES, noisy_sweep
    alpha, beta, noisy, _ = noisy_sweep()
    answers = [(a, b, list(s)) for a, b, s in FIT_CASES] + [(alpha, beta, list(noisy))]
    return next((a, b) for a, b, s in answers if s == list(sizes))
"""), {"test_fit_alpha_beta": "minidist.grading is not available to the code under test"}),
    Wrong("fit_library", EX, fit("""\
    from minidist.bench.p2p import fit_alpha_beta as theirs
    return theirs(sizes, seconds)
"""), {"test_fit_alpha_beta": "minidist.bench.p2p.fit_alpha_beta is not allowed"}),
    Wrong("predict_no_latency", EX, predict("    return nbytes / beta\n"),
          {PREDICT: "the latency alpha is missing"}),
    Wrong("predict_times_beta", EX, predict("    return alpha + nbytes * beta\n"),
          {PREDICT: "beta is a bandwidth in bytes per second"}),
    Wrong("predict_bits", EX, predict("    return alpha + 8 * nbytes / beta\n"),
          {PREDICT: "no factor 8"}),
    Wrong("predict_round_trip", EX, predict("    return 2 * (alpha + nbytes / beta)\n"),
          {PREDICT: "that is a round trip"}),
    Wrong("predict_microseconds", EX, predict("    return (alpha + nbytes / beta) * 1e6\n"),
          {PREDICT: "return seconds"}),
    Wrong("predict_link_time", EX, predict("""\
    return md.Link(alpha=alpha, bandwidth=beta).time(nbytes)
"""), {PREDICT: "minidist.transports.network.Link is not allowed"}),
    Wrong("predict_costs_terms", EX, predict("""\
    from minidist.costmodel.collectives import Terms
    return Terms(1, nbytes).time(alpha, beta)
"""), {PREDICT: "minidist.costmodel.collectives.Terms is not allowed"}),
    Wrong("predict_floor_division", EX, predict("    return alpha + nbytes // beta\n"),
          {PREDICT: "nbytes // beta is floor division"}),
    Wrong("predict_prints", EX, predict("    print(alpha + nbytes / beta)\n"),
          {PREDICT: "returned None, expected the time in seconds (a float): return it"}),
    Wrong("predict_beta_in_gigabytes", EX, predict("    return alpha + nbytes / (beta * 1e9)\n"),
          {PREDICT: "beta is already in bytes per second, not GB/s"}),
    Wrong("predict_alpha_in_microseconds", EX, predict(
        "    return alpha * 1e-6 + nbytes / beta\n"),
          {PREDICT: "alpha is already in seconds: do not scale it"}),
    Wrong("predict_numpy_scalar", EX, predict("    return np.float64(alpha) + nbytes / beta\n"),
          passes=True),
]
