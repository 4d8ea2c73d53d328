"""Wrong answers to exercise 01, and calls to the library or torch that must earn nothing."""

from . import Wrong

EX = "01_collectives"
NAIVE, RS = "test_naive_all_reduce", "test_ring_reduce_scatter"
AG, RING = "test_ring_all_gather", "test_ring_all_reduce"
REPLACED = "was replaced by a new tensor, so the caller's tensor never got it"
LIBRARY = "calls what this exercise asks you to write yourself"
RING_HEAD = "    p, r = comm.world_size, comm.rank\n    right, left = (r + 1) % p, (r - 1) % p\n"


def naive(body: str) -> dict:
    return {"naive_all_reduce": "def naive_all_reduce(comm, t):\n" + body}


def rs(body: str) -> dict:
    return {"ring_reduce_scatter": "def ring_reduce_scatter(comm, chunks):\n" + RING_HEAD + body}


def ag(body: str) -> dict:
    return {"ring_all_gather": "def ring_all_gather(comm, chunks):\n" + RING_HEAD + body}


def ring(body: str) -> dict:
    return {"ring_all_reduce": "def ring_all_reduce(comm, t):\n" + body}


HD = "test_halving_doubling_all_reduce"
HALVING = """\
    p, r = comm.world_size, comm.rank
    flat = t.view(-1)
    sizes = [c.numel() for c in flat.tensor_split(p)]
    start = [sum(sizes[:k]) for k in range(p + 1)]
    chunks = lambda lo, hi: flat[start[lo]:start[hi]]
    lo, hi, bit = 0, p, p // 2
    while bit:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r & bit == 0 else ((mid, hi), (lo, mid))
        received = torch.empty_like(chunks(*keep))
        comm.sendrecv(chunks(*give), r ^ bit, received, r ^ bit)
        chunks(*keep).add_(received)
        (lo, hi), bit = keep, bit // 2
"""
DOUBLING = """\
    bit = 1
    while bit < p:
        width = hi - lo
        other = (lo - width, lo) if r & bit else (hi, hi + width)
        comm.sendrecv(chunks(lo, hi), r ^ bit, chunks(*other), r ^ bit)
        lo, hi, bit = min(lo, other[0]), max(hi, other[1]), bit * 2
    return t
"""


def hd(body: str) -> dict:
    return {"halving_doubling_all_reduce":
            "def halving_doubling_all_reduce(comm, t):\n" + body}


WRONG = [
    Wrong("naive_root_never_sends_back", EX, naive("""\
    if comm.rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, comm.world_size):
            comm.recv(buf, src)
            t += buf
    else:
        comm.send(t, 0)
        comm.recv(t, 0)
    return t
"""), {NAIVE: "rank 0 returned from naive_all_reduce and waits for the others; rank 1 waits "
              "in recv from rank 0"}),
    Wrong("naive_everyone_to_everyone", EX, naive("""\
    others = [r for r in range(comm.world_size) if r != comm.rank]
    bufs = [torch.empty_like(t) for _ in others]
    reqs = [comm.irecv(b, r) for b, r in zip(bufs, others)]
    for r in others:
        comm.send(t, r)
    for req, b in zip(reqs, bufs):
        req.wait()
        t += b
    return t
"""), {NAIVE: "rank 1 sent 28 bytes to rank 0, 28 bytes to rank 2"}),
    Wrong("naive_md_all_reduce", EX, naive("    return md.all_reduce(comm, t)\n"),
          {NAIVE: LIBRARY}),
    Wrong("naive_api_all_reduce", EX, naive("""\
    from minidist.collectives.api import all_reduce
    return all_reduce(comm, t, algorithm="naive")
"""), {NAIVE: "minidist.collectives.api.all_reduce is not allowed in this exercise"}),
    Wrong("naive_all_reduce_coalesced", EX, naive("""\
    import minidist.collectives
    minidist.collectives.all_reduce_coalesced(comm, [t])
    return t
"""), {NAIVE: "all_reduce_coalesced is not allowed in this exercise"}),
    Wrong("naive_algorithm_module", EX, naive("""\
    from minidist.collectives import allreduce
    return allreduce.naive(comm, t, "sum")
"""), {NAIVE: "minidist.collectives.allreduce.naive is not allowed"}),
    Wrong("rs_off_by_one_chunk", EX, rs("""\
    for s in range(p - 1):
        send_i, recv_i = (r - s) % p, (r - s - 1) % p
        got = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], right, got, left)
        chunks[recv_i] += got
"""), {RS: "missing rank(s) [1]", RING: "missing rank(s) [1]"}),
    Wrong("rs_whole_buffer", EX, rs("""\
    whole = torch.cat(chunks)
    for s in range(p - 1):
        got = torch.empty_like(whole)
        comm.sendrecv(whole, right, got, left)
        whole = got
        chunks[r] += got.tensor_split(p)[r]
"""), {RS: "a ring reduce-scatter sends (p-1)/p·n", RING: "more than the 2(p-1)/p·n"}),
    Wrong("rs_send_before_recv", EX, rs("""\
    for s in range(p - 1):
        send_i, recv_i = (r - s - 1) % p, (r - s - 2) % p
        got = torch.empty_like(chunks[recv_i])
        comm.send(chunks[send_i], right)
        comm.recv(got, left)
        chunks[recv_i] += got
"""), {RS: "deadlock in ring_reduce_scatter at `comm.send(chunks[send_i], right)`",
        RING: "deadlock in ring_all_reduce at `comm.send(chunks[send_i], right)`"}),
    Wrong("rs_straight_to_owner", EX, rs("""\
    reqs = [comm.isend(chunks[j], j) for j in range(p) if j != r]
    for src in range(p):
        if src != r:
            got = torch.empty_like(chunks[r])
            comm.recv(got, src)
            chunks[r] += got
    for q in reqs:
        q.wait()
"""), {RS: "only to its right neighbour", RING: "only to its right neighbour"}),
    Wrong("ag_send_before_recv", EX, ag("""\
    for s in range(p - 1):
        comm.send(chunks[(r - s) % p], right)
        comm.recv(chunks[(r - s - 1) % p], left)
"""), {AG: "deadlock in ring_all_gather at `comm.send(chunks[(r - s) % p], right)`",
        RING: "deadlock in ring_all_reduce"}),
    Wrong("ag_off_by_one", EX, ag("""\
    for s in range(p - 1):
        comm.sendrecv(chunks[(r - s - 1) % p], right, chunks[(r - s - 2) % p], left)
"""), {AG: "was never written: that chunk never reached this rank", RING: "values wrong"}),
    Wrong("ag_md_all_gather", EX, ag("""\
    parts = md.all_gather(comm, chunks[r])
"""), {AG: LIBRARY, RING: LIBRARY}),
    Wrong("ring_whole_buffers", EX, ring("""\
    p, r = comm.world_size, comm.rank
    mine, passing = t.clone(), t.clone()
    for _ in range(p - 1):
        got = torch.empty_like(t)
        comm.sendrecv(passing, (r + 1) % p, got, (r - 1) % p)
        t += got
        passing = got
    return t
"""), {RING: "a ring all_reduce sends one chunk per step, 2(p-1) = 2 messages"}),
    Wrong("ring_rows_not_flattened", EX, ring("""\
    chunks = list(t.tensor_split(comm.world_size))
    ring_reduce_scatter(comm, chunks)
    ring_all_gather(comm, chunks)
    return t
"""), {RING: "t.tensor_split(p) cuts its rows"}),
    Wrong("ring_library_ring", EX, ring("""\
    import minidist.collectives.allreduce as algorithms
    return algorithms.ring(comm, t, "sum")
"""), {RING: "minidist.collectives.allreduce.ring is not allowed"}),
    Wrong("ring_library_ring_fake_comm", EX, ring("""\
    from minidist.collectives.allreduce import ring

    class Plain:
        def __getattr__(self, name):
            return getattr(comm, name)
        collective = comm
    return ring(Plain(), t, "sum")
"""), {RING: "minidist.collectives.allreduce.ring is not allowed"}),
    Wrong("ring_collective_channel", EX, ring("""\
    p, r = comm.world_size, comm.rank
    chunks = list(t.view(-1).tensor_split(p))
    for s in range(p - 1):
        got = torch.empty_like(chunks[(r - s - 2) % p])
        comm.collective.sendrecv(chunks[(r - s - 1) % p], (r + 1) % p, got, (r - 1) % p)
        chunks[(r - s - 2) % p] += got
    for s in range(p - 1):
        comm.collective.sendrecv(chunks[(r - s) % p], (r + 1) % p, chunks[(r - s - 1) % p],
                                 (r - 1) % p)
    return t
"""), {RING: "comm.collective"}),
    Wrong("ring_control_channel", EX, ring("""\
    p, r = comm.world_size, comm.rank
    chunks = list(t.view(-1).tensor_split(p))
    for s in range(p - 1):
        got = torch.empty_like(chunks[(r - s - 2) % p])
        comm.control.sendrecv(chunks[(r - s - 1) % p], (r + 1) % p, got, (r - 1) % p)
        chunks[(r - s - 2) % p] += got
    for s in range(p - 1):
        comm.control.sendrecv(chunks[(r - s) % p], (r + 1) % p, chunks[(r - s - 1) % p],
                              (r - 1) % p)
    return t
"""), {RING: "control channel"}),
    Wrong("ring_shared_memory", EX, ring("""\
    from minidist.collectives import shared_memory
    shared_memory.all_reduce_shm(comm, [t], "sum")
    return t
"""), {RING: LIBRARY}),
    Wrong("ring_torch_distributed", EX, ring("""\
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file:///tmp/md-grading-bypass",
                            rank=comm.rank, world_size=comm.world_size)
    dist.all_reduce(t)
    return t
"""), {RING: "torch.distributed.init_process_group is not allowed"}),
    Wrong("ring_naive_hidden_stats", EX, ring("""\
    naive_all_reduce(comm, t)
    comm.stats.reset()
    return t
"""), {RING: "comm.stats does not match"}),
    Wrong("hd_recursive_doubling", EX, hd("""\
    buf, bit = torch.empty_like(t), 1
    while bit < comm.world_size:
        comm.sendrecv(t, comm.rank ^ bit, buf, comm.rank ^ bit)
        t += buf
        bit *= 2
    return t
"""), {HD: "2 lg p = 2 messages"}),
    Wrong("hd_halving_only", EX, hd(HALVING + "    return t\n"),
          {HD: "missing rank(s) [1]. In each halving round"}),
    Wrong("hd_doubling_sends_everything", EX, hd(HALVING + """\
    bit, whole = 1, torch.empty_like(flat)
    while bit < p:
        comm.sendrecv(flat, r ^ bit, whole, r ^ bit)
        other = (lo - (hi - lo), lo) if r & bit else (hi, hi + (hi - lo))
        chunks(*other).copy_(whole[start[other[0]]:start[other[1]]])
        lo, hi, bit = min(lo, other[0]), max(hi, other[1]), bit * 2
    return t
"""), {HD: "more than the 8000 bytes of halving-doubling"}),
    Wrong("hd_send_before_recv", EX, hd("""\
    p, r, bit = comm.world_size, comm.rank, comm.world_size // 2
    flat = t.view(-1)
    while bit:
        half = flat.numel() // 2
        comm.send(flat[:half].clone(), r ^ bit)
        comm.recv(flat[half:].clone(), r ^ bit)
        bit //= 2
    return t
"""), {HD: "deadlock in halving_doubling_all_reduce at `comm.send(flat[:half].clone()"}),
    Wrong("hd_library", EX, hd("""\
    from minidist.collectives.allreduce import halving_doubling
    return halving_doubling(comm, t.view(-1), "sum")
"""), {HD: "minidist.collectives.allreduce.halving_doubling is not allowed"}),
    Wrong("hd_md_all_reduce", EX, hd("""\
    return md.all_reduce(comm, t, algorithm="halving_doubling")
"""), {HD: LIBRARY}),
    # -- naive: steps in the wrong order, not in place, the wrong op -----------------------
    Wrong("naive_root_sends_partial_sums", EX, naive("""\
    if comm.rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, comm.world_size):
            comm.recv(buf, src)
            t += buf
            comm.send(t, src)
    else:
        comm.send(t, 0)
        comm.recv(t, 0)
    return t
"""), {NAIVE: "missing rank(s) [2]"}),
    Wrong("naive_not_in_place", EX, naive("""\
    if comm.rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, comm.world_size):
            comm.recv(buf, src)
            t = t + buf
        for dst in range(1, comm.world_size):
            comm.send(t, dst)
    else:
        comm.send(t, 0)
        total = torch.empty_like(t)
        comm.recv(total, 0)
        t = total
    return t
"""), {NAIVE: "t = t + buf makes a new tensor, and the caller's t never sees it"}),
    Wrong("naive_root_receives_into_t", EX, naive("""\
    if comm.rank == 0:
        for src in range(1, comm.world_size):
            comm.recv(t, src)
        for dst in range(1, comm.world_size):
            comm.send(t, dst)
    else:
        comm.send(t, 0)
        comm.recv(t, 0)
    return t
"""), {NAIVE: "missing rank(s) [0"}),
    Wrong("naive_average", EX, naive("""\
    if comm.rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, comm.world_size):
            comm.recv(buf, src)
            t += buf
        t.div_(comm.world_size, rounding_mode="floor" if not t.is_floating_point() else None)
        for dst in range(1, comm.world_size):
            comm.send(t, dst)
    else:
        comm.send(t, 0)
        comm.recv(t, 0)
    return t
"""), {NAIVE: "that is the mean over the 2 ranks: this all_reduce sums"}),
    Wrong("naive_receive_first", EX, naive("""\
    if comm.rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, comm.world_size):
            comm.recv(buf, src)
            t += buf
        for dst in range(1, comm.world_size):
            comm.send(t, dst)
    else:
        total = torch.empty_like(t)
        comm.recv(total, 0)
        comm.send(t, 0)
        t.copy_(total)
    return t
"""), {NAIVE: "rank 1: waits in `comm.recv(total, 0)`"}),
    # -- reduce-scatter ---------------------------------------------------------------
    Wrong("rs_replaces_list_entries", EX, rs("""\
    for s in range(p - 1):
        send_i, recv_i = (r - s - 1) % p, (r - s - 2) % p
        received = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], right, received, left)
        chunks[recv_i] = chunks[recv_i] + received
"""), {RS: REPLACED, RING: "missing rank(s)"}),
    Wrong("rs_receives_over_its_chunk", EX, rs("""\
    for s in range(p - 1):
        send_i, recv_i = (r - s - 1) % p, (r - s - 2) % p
        comm.sendrecv(chunks[send_i], right, chunks[recv_i], left)
"""), {RS: "missing rank(s) [0", RING: "missing rank(s)"}),
    Wrong("rs_ring_to_the_left", EX, rs("""\
    for s in range(p - 1):
        send_i, recv_i = (r + s + 1) % p, (r + s + 2) % p
        received = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], left, received, right)
        chunks[recv_i] += received
"""), {RS: "only to its right neighbour rank 1", RING: "only to its right neighbour"}),
    Wrong("rs_one_step_short", EX, rs("""\
    for s in range(p - 2):
        send_i, recv_i = (r - s - 1) % p, (r - s - 2) % p
        received = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], right, received, left)
        chunks[recv_i] += received
"""), {RS: "missing rank(s) [", RING: "missing rank(s)"}),
    Wrong("rs_one_step_too_many", EX, rs("""\
    for s in range(p):
        send_i, recv_i = (r - s - 1) % p, (r - s - 2) % p
        received = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], right, received, left)
        chunks[recv_i] += received
"""), {RS: "counted twice", RING: "counted twice"}),
    # -- all-gather ---------------------------------------------------------------------
    Wrong("ag_ring_to_the_left", EX, ag("""\
    for s in range(p - 1):
        comm.sendrecv(chunks[(r + s) % p], left, chunks[(r + s + 1) % p], right)
"""), {AG: "only to its right neighbour rank 1", RING: "only to its right neighbour"}),
    Wrong("ag_replaces_list_entries", EX, ag("""\
    for s in range(p - 1):
        received = torch.empty_like(chunks[(r - s - 1) % p])
        comm.sendrecv(chunks[(r - s) % p], right, received, left)
        chunks[(r - s - 1) % p] = received
"""), {AG: REPLACED, RING: "missing rank(s)"}),
    Wrong("ag_one_step_short", EX, ag("""\
    for s in range(p - 2):
        comm.sendrecv(chunks[(r - s) % p], right, chunks[(r - s - 1) % p], left)
"""), {AG: "was never written: that chunk never reached this rank",
        RING: "missing rank(s) [1]"}),
    Wrong("ag_one_step_too_many", EX, ag("""\
    for s in range(p):
        comm.sendrecv(chunks[(r - s) % p], right, chunks[(r - s - 1) % p], left)
"""), {AG: "exactly, one chunk per step", RING: "more than the 2(p-1)/p·n"}),
    Wrong("ag_whole_buffer", EX, ag("""\
    for s in range(p - 1):
        whole, got = torch.cat(chunks), torch.empty(sum(c.numel() for c in chunks),
                                                     dtype=chunks[r].dtype)
        comm.sendrecv(whole, right, got, left)
        j = (r - s - 1) % p
        chunks[j].copy_(got.split([c.numel() for c in chunks])[j])
"""), {AG: "exactly, one chunk per step", RING: "more than the 2(p-1)/p·n"}),
    Wrong("ag_straight_to_everyone", EX, ag("""\
    reqs = [comm.isend(chunks[r], q) for q in range(p) if q != r]
    for q in range(p):
        if q != r:
            comm.recv(chunks[q], q)
    for req in reqs:
        req.wait()
"""), {AG: "only to its right neighbour", RING: "only to its right neighbour"}),
    Wrong("ag_first_step_unrolled", EX, ag("""\
    comm.sendrecv(chunks[r], right, chunks[left], left)
    for s in range(1, p - 1):
        comm.sendrecv(chunks[(r - s) % p], right, chunks[(r - s - 1) % p], left)
"""), {AG: "world_size=1", RING: "world_size=1"}),
    # -- halving-doubling -------------------------------------------------------------
    Wrong("hd_ring_unless_power_of_two_squared", EX, hd("""\
    import math
    p = comm.world_size
    if int(math.log2(max(p, 1))) ** 2 != p:  # meant 2 ** lg p: true at 2 and 8
        return ring_all_reduce(comm, t)  # not a power of two: the ring
""" + HALVING + DOUBLING), {HD: "2 lg p = 6 messages"}),
    Wrong("hd_copies_instead_of_adding", EX, hd(HALVING.replace(
        "chunks(*keep).add_(received)", "chunks(*keep).copy_(received)") + DOUBLING),
        {HD: "missing rank(s) [0]. In each halving round"}),
    Wrong("hd_not_in_place", EX, hd("""\
    t = t.clone()  # leave the caller's tensor alone
""" + HALVING + DOUBLING), {HD: "t = t + buf makes a new tensor"}),
    Wrong("hd_rows_not_flattened", EX, hd(HALVING.replace("flat = t.view(-1)", "flat = t").replace(
        "c.numel() for c", "len(c) for c") + DOUBLING), {HD: "t.tensor_split(p) cuts its rows"}),
    Wrong("hd_halves_of_elements", EX, hd("""\
    p, r, flat = comm.world_size, comm.rank, t.view(-1)
    lo, hi, bit, given = 0, flat.numel(), p // 2, []
    while bit:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r & bit == 0 else ((mid, hi), (lo, mid))
        received = torch.empty_like(flat[keep[0]:keep[1]])
        comm.sendrecv(flat[give[0]:give[1]], r ^ bit, received, r ^ bit)
        flat[keep[0]:keep[1]] += received
        given.append(give)
        (lo, hi), bit = keep, bit // 2
    bit = 1
    for other in reversed(given):
        comm.sendrecv(flat[lo:hi], r ^ bit, flat[other[0]:other[1]], r ^ bit)
        lo, hi, bit = min(lo, other[0]), max(hi, other[1]), bit * 2
    return t
"""), passes=True),
]
