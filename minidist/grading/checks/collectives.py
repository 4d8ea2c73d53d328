"""Tests of exercise 01: naive all_reduce, ring reduce-scatter, ring all-gather, ring
all_reduce, on world sizes 1 to 5 and lengths that do not divide evenly, with the bytes
each rank sent checked against the formulas."""

from __future__ import annotations

import torch

from ..feedback import Mistake, compare
from ..registry import GradedTest
from .harness import contributors, pattern, run_ranks, stats_of

WORLD_SIZES = (1, 2, 3, 4, 5)
CASES = [(7, torch.float32), (1000, torch.float64), (2, torch.int64), (1, torch.float32),
         (0, torch.float32)]
LIBRARY = ("all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast")
HINTS = {"naive": "", "ring_all_reduce": "",
         "reduce_scatter": ". Rank r must end with chunk r (chunks[comm.rank]) summed over "
                           "all ranks: in step s send chunk (r - s - 1) % p, add into chunk "
                           "(r - s - 2) % p",
         "all_gather": ". Rank r starts with chunk r: in step s send chunk (r - s) % p and "
                       "receive chunk (r - s - 1) % p"}


def _forbid_library_collectives() -> None:
    """In this rank's process only: the exercise builds collectives from send and recv."""
    import minidist

    def forbidden(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"md.{name} is off limits in this exercise: build it from "
                               "comm.send/recv/isend/irecv/sendrecv")
        return call

    for name in LIBRARY:
        setattr(minidist, name, forbidden(name))


def _body(comm, fn, kind, cases):
    _forbid_library_collectives()
    p, out = comm.world_size, []
    for n, dtype in cases:
        t = pattern(comm.rank, n, dtype, p)
        chunks = list(t.tensor_split(p))
        if kind == "all_gather":
            for j, c in enumerate(chunks):
                if j != comm.rank:
                    c.fill_(-1)  # not known yet: the all-gather must fill it
        comm.stats.reset()
        fn(comm, t if kind in ("naive", "ring_all_reduce") else chunks)
        result = chunks[comm.rank] if kind == "reduce_scatter" else (
            torch.cat(chunks) if kind == "all_gather" else t)
        out.append((result.clone(), stats_of(comm)))
    return out


def _expected(kind, rank, n, dtype, p):
    every = [pattern(r, n, dtype, p) for r in range(p)]
    if kind == "all_gather":
        return torch.cat([every[j].tensor_split(p)[j] for j in range(p)])
    total = torch.stack(every).sum(0).to(dtype) if p else every[0]
    return total.tensor_split(p)[rank] if kind == "reduce_scatter" else total


def _run_all(fn, kind, name, expected_bytes) -> None:
    for p in WORLD_SIZES:
        ranks = run_ranks(_body, p, (fn, kind, CASES), name, f"world_size={p}")
        for (n, dtype), results in zip(CASES, zip(*ranks)):
            case = f"world_size={p}, n={n}, dtype={str(dtype)[6:]}"
            sizes = [c.numel() * dtype.itemsize for c in torch.empty(n).tensor_split(p)]
            for rank, (got, stats) in enumerate(results):
                want = _expected(kind, rank, n, dtype, p)
                problem = compare(got, want, f"rank {rank}")
                if problem:
                    offset = sum(sizes[:rank]) // dtype.itemsize if kind == "reduce_scatter" \
                        else 0
                    raise Mistake(f"with {case}: {problem}"
                                  f"{_whose(got, want, offset, p, kind)}{HINTS[kind]}")
                expected_bytes(rank, p, n * dtype.itemsize, sizes, stats, case)


def _whose(got, want, offset, p, kind) -> str:
    """Which ranks' data the first wrong value holds (the test data makes it decodable)."""
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape):
        return ""
    wrong = (got.double() != want.double()).nonzero().flatten().tolist()
    if not wrong:
        return ""
    i = wrong[0]
    have = contributors(got[i].item(), offset + i, p)
    need = contributors(want[i].item(), offset + i, p)
    if have is None or need is None:
        return " (a value counted twice, or taken from another position)"
    missing = sorted(set(need) - set(have))
    extra = sorted(set(have) - set(need))
    text = f"; [{i}] holds the data of rank(s) {have or 'none'}"
    if missing:
        text += f", missing rank(s) {missing}"
    if extra:
        text += f", but should not include rank(s) {extra}"
    return text


def _only_to(stats, peer) -> bool:
    return set(stats["sent_to"]) <= {peer} and all(
        b == 0 for q, b in stats["sent_to"].items() if q != peer)


def _traffic(stats) -> str:
    return ", ".join(f"{b} bytes to rank {q}" for q, b in sorted(stats["sent_to"].items())) \
        or "nothing"


# -- naive ----------------------------------------------------------------------------------
def _naive_bytes(rank, p, nbytes, sizes, stats, case) -> None:
    want = (p - 1) * nbytes if rank == 0 else (nbytes if p > 1 else 0)
    ok = stats["bytes_sent"] == want and (rank == 0 or _only_to(stats, 0))
    if not ok:
        role = (f"sends the result to each of the {p - 1} other ranks" if rank == 0
                else "sends its tensor to rank 0, once")
        raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; in the naive "
                      f"all_reduce rank {rank} {role}: {want} bytes")


def check_naive_all_reduce(naive_all_reduce) -> str:
    _run_all(naive_all_reduce, "naive", "naive_all_reduce", _naive_bytes)
    return "right sums and traffic on world sizes 1 to 5, lengths 0 to 1000, 3 dtypes"


# -- ring ---------------------------------------------------------------------------------
def _ring_bytes(phase: str, skip: int):
    """Bytes check for a ring phase: rank r sends every chunk but chunk (r + skip) % p."""
    def check(rank, p, nbytes, sizes, stats, case) -> None:
        want = nbytes - sizes[(rank + skip) % p] if p > 1 else 0
        right = (rank + 1) % p
        if stats["bytes_sent"] > want or not _only_to(stats, right):
            raise Mistake(
                f"with {case}: rank {rank} sent {_traffic(stats)}; a ring {phase} sends "
                f"(p-1)/p·n = {want} bytes here, one chunk per step, only to its right "
                f"neighbour rank {right}")
    return check


def _all_reduce_bytes(rank, p, nbytes, sizes, stats, case) -> None:
    want = 2 * nbytes - sizes[rank] - sizes[(rank + 1) % p] if p > 1 else 0
    right = (rank + 1) % p
    if stats["bytes_sent"] > want:
        raise Mistake(
            f"with {case}: rank {rank} sent {stats['bytes_sent']} bytes, more than the "
            f"2(p-1)/p·n = {want} bytes of a ring all_reduce (n = {nbytes} bytes): a "
            "reduce-scatter then an all-gather, each sending one chunk per step")
    if not _only_to(stats, right):
        raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; in a ring every "
                      f"rank sends only to its right neighbour, rank {right}")


def check_ring_reduce_scatter(ring_reduce_scatter) -> str:
    _run_all(ring_reduce_scatter, "reduce_scatter", "ring_reduce_scatter",
             _ring_bytes("reduce-scatter", 0))
    return "chunk r summed on rank r, (p-1)/p·n bytes per rank, world sizes 1 to 5"


def check_ring_all_gather(ring_all_gather) -> str:
    _run_all(ring_all_gather, "all_gather", "ring_all_gather", _ring_bytes("all-gather", 1))
    return "every chunk everywhere, (p-1)/p·n bytes per rank, world sizes 1 to 5"


def check_ring_all_reduce(ring_all_reduce) -> str:
    _run_all(ring_all_reduce, "ring_all_reduce", "ring_all_reduce", _all_reduce_bytes)
    return "right sums with 2(p-1)/p·n bytes per rank on world sizes 1 to 5"


TESTS = [
    GradedTest("test_naive_all_reduce", 2, ("naive_all_reduce",), check_naive_all_reduce),
    GradedTest("test_ring_reduce_scatter", 3, ("ring_reduce_scatter",),
               check_ring_reduce_scatter),
    GradedTest("test_ring_all_gather", 2, ("ring_all_gather",), check_ring_all_gather),
    GradedTest("test_ring_all_reduce", 3, ("ring_all_reduce",), check_ring_all_reduce),
]
