"""Tests of exercise 01: naive all_reduce, ring reduce-scatter, ring all-gather, ring
all_reduce, on world sizes 1 to 5, lengths that do not divide evenly and 2-D tensors, with
the bytes each rank sent checked against the formulas; and the stretch part, halving-doubling
all_reduce on world sizes 1 to 8 (powers of two), with its messages (2 lg p per rank, to
its lg p hypercube neighbours) and bytes (``costs.bytes_sent``). minidist's and torch's
collectives are out of reach while they run (``sandbox.COLLECTIVES``)."""

from __future__ import annotations

import torch

from ...collectives import costs
from ..engine.compare import compare
from ..engine.data import contributors, pattern
from ..engine.feedback import Mistake, traffic_text
from ..engine.sandbox import COLLECTIVES
from ..engine.spec import GradedTest

WORLD_SIZES = (1, 2, 3, 4, 5)
CASES_1D = [(7, torch.float32), (1000, torch.float64), (2, torch.int64), (1, torch.float32),
            (0, torch.float32)]
CASES_2D = [((4, 3), torch.float32), ((3, 5), torch.float64)]
POWERS_OF_TWO = (1, 2, 4, 8)
CASES_HD = [(1000, torch.float64), (13, torch.float32), (6, torch.int64), (0, torch.float32),
            ((4, 6), torch.float32)]
HINTS = {
    "naive": "", "ring_all_reduce": "",
    "halving_doubling": ". In each halving round partners (ranks whose numbers differ in one "
                        "bit) split the range of chunks they are both working on: each keeps "
                        "one half, sends the other, and adds what it receives into the half it "
                        "keeps, so after lg p rounds each rank holds one chunk summed over "
                        "every rank; the doubling replays the rounds in reverse, partners "
                        "swapping the ranges they hold complete",
    "reduce_scatter": ". Follow one chunk around the ring: at each step a rank adds its own "
                      "part to the partial sum it received and passes it on; after p-1 steps "
                      "the sum ends on one rank, which must be the chunk's owner (chunk r on "
                      "rank r): choose where each chunk starts so that it ends there",
    "all_gather": ". Rank r starts with only its own chunk final; at each step pass on the "
                  "chunk you received at the step before (first your own), so that after "
                  "p-1 steps every chunk has gone round the ring",
}
KINDS = {  # kind: (function name, cases)
    "naive": ("naive_all_reduce", CASES_1D + CASES_2D),
    "reduce_scatter": ("ring_reduce_scatter", CASES_1D),
    "all_gather": ("ring_all_gather", CASES_1D),
    "ring_all_reduce": ("ring_all_reduce", CASES_1D + CASES_2D),
    "halving_doubling": ("halving_doubling_all_reduce", CASES_HD),
}
IN_PLACE = ("naive", "ring_all_reduce", "halving_doubling")  # they take t, not chunks


def _case(comm, namespace, kind, n, dtype):
    p = comm.world_size
    t = pattern(comm.rank, n, dtype, p)
    chunks = list(t.tensor_split(p))
    if kind == "all_gather":
        for j, c in enumerate(chunks):
            if j != comm.rank:
                c.fill_(-1)  # not known yet: the all-gather must fill it
    namespace[KINDS[kind][0]](comm, t if kind in IN_PLACE else chunks)
    if kind == "reduce_scatter":
        return chunks[comm.rank]
    return torch.cat(chunks) if kind == "all_gather" else t


def _expected(kind, rank, n, dtype, p):
    every = [pattern(r, n, dtype, p) for r in range(p)]
    if kind == "all_gather":
        return torch.cat([every[j].tensor_split(p)[j] for j in range(p)])
    total = torch.stack(every).sum(0).to(dtype)
    return total.tensor_split(p)[rank] if kind == "reduce_scatter" else total


def _label(p, n, dtype) -> str:
    size = f"n={n}" if isinstance(n, int) else f"shape={tuple(n)}"
    return f"world_size={p}, {size}, dtype={str(dtype)[6:]}"


def _run_all(learner, kind, expected_bytes, world_sizes=WORLD_SIZES) -> None:
    name, cases = KINDS[kind]
    for p in world_sizes:
        labels = [_label(p, n, dtype) for n, dtype in cases]
        ranks = learner.run_ranks(_case, p, [(kind, n, d) for n, d in cases], name, labels)
        for k, ((n, dtype), case) in enumerate(zip(cases, labels)):
            numel = pattern(0, n, dtype, p).numel()
            sizes = [c.numel() * dtype.itemsize for c in torch.empty(numel).tensor_split(p)]
            for rank in range(p):
                got, traffic = ranks[rank][k]["value"], ranks[rank][k]["traffic"]
                want = _expected(kind, rank, n, dtype, p)
                problem = compare(got, want, f"rank {rank}")
                if problem:
                    offset = sum(sizes[:rank]) // dtype.itemsize \
                        if kind == "reduce_scatter" else 0
                    raise Mistake(f"with {case}: {problem}"
                                  f"{_whose(got, want, offset, p)}{HINTS[kind]}")
                expected_bytes(rank, p, numel * dtype.itemsize, sizes, traffic, case,
                               _shape_hint(n, p))


def _shape_hint(n, p) -> str:
    if isinstance(n, int):
        return ""
    return (f". t has shape {tuple(n)}: t.tensor_split(p) cuts its rows, and {n[0]} rows "
            f"cannot be shared fairly by {p} ranks; cut the flattened tensor instead "
            "(t.view(-1) is a view of t, and so are its chunks)")


def _whose(got, want, offset, p) -> str:
    """Which ranks' data the first wrong value holds (the test data makes it decodable)."""
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape):
        return ""
    got, want = got.flatten(), want.flatten()
    wrong = (got.double() != want.double()).nonzero().flatten().tolist()
    if not wrong:
        return ""
    i = wrong[0]
    if got[i].item() == -1 and want[i].item() != -1:  # the all-gather test's "unknown" fill
        return f"; [{i}] was never written: that chunk never reached this rank"
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
def _naive_bytes(rank, p, nbytes, sizes, stats, case, shape_hint) -> None:
    want = (p - 1) * nbytes if rank == 0 else (nbytes if p > 1 else 0)
    ok = stats["bytes_sent"] == want and (rank == 0 or _only_to(stats, 0))
    if not ok:
        role = (f"sends the result to each of the {p - 1} other ranks" if rank == 0
                else "sends its tensor to rank 0, once")
        raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; in the naive "
                      f"all_reduce rank {rank} {role}: {want} bytes")


def check_naive_all_reduce(learner) -> str:
    _run_all(learner, "naive", _naive_bytes)
    return "right sums and traffic on world sizes 1 to 5, lengths 0 to 1000, 2-D, 3 dtypes"


# -- ring ---------------------------------------------------------------------------------
def _ring_bytes(phase: str, skip: int):
    """Bytes check for a ring phase: rank r sends every chunk but chunk (r + skip) % p."""
    def check(rank, p, nbytes, sizes, stats, case, shape_hint) -> None:
        want = nbytes - sizes[(rank + skip) % p] if p > 1 else 0
        right = (rank + 1) % p
        if stats["bytes_sent"] > want or not _only_to(stats, right):
            raise Mistake(
                f"with {case}: rank {rank} sent {_traffic(stats)}; a ring {phase} sends "
                f"(p-1)/p·n = {want} bytes here, one chunk per step, only to its right "
                f"neighbour rank {right}")
    return check


def _all_reduce_bytes(rank, p, nbytes, sizes, stats, case, shape_hint) -> None:
    want = 2 * nbytes - sizes[rank] - sizes[(rank + 1) % p] if p > 1 else 0
    right = (rank + 1) % p
    if stats["bytes_sent"] > want:
        raise Mistake(
            f"with {case}: rank {rank} sent {stats['bytes_sent']} bytes, more than the "
            f"2(p-1)/p·n = {want} bytes of a ring all_reduce (n = {nbytes} bytes): a "
            "reduce-scatter then an all-gather, each sending one chunk per step, the chunks "
            f"as equal as they can be{shape_hint}")
    if not _only_to(stats, right):
        raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; in a ring every "
                      f"rank sends only to its right neighbour, rank {right}")


def check_ring_reduce_scatter(learner) -> str:
    _run_all(learner, "reduce_scatter", _ring_bytes("reduce-scatter", 0))
    return "chunk r summed on rank r, (p-1)/p·n bytes per rank, world sizes 1 to 5"


def check_ring_all_gather(learner) -> str:
    _run_all(learner, "all_gather", _ring_bytes("all-gather", 1))
    return "every chunk everywhere, (p-1)/p·n bytes per rank, world sizes 1 to 5"


def check_ring_all_reduce(learner) -> str:
    _run_all(learner, "ring_all_reduce", _all_reduce_bytes)
    return "right sums with 2(p-1)/p·n bytes per rank on world sizes 1 to 5, 1-D and 2-D"


# -- halving-doubling (stretch) -------------------------------------------------------------
def _halving_doubling_traffic(rank, p, nbytes, sizes, stats, case, shape_hint) -> None:
    partners = sorted(rank ^ (1 << k) for k in range(p.bit_length() - 1))
    sent = stats["messages_to"]
    if set(sent) - set(partners) or (min(sizes) > 0 and sent != {q: 2 for q in partners}):
        raise Mistake(
            f"with {case}: rank {rank} sent {traffic_text(stats)}; in halving-doubling rank "
            f"{rank} talks only to the ranks whose number differs from its own in one bit "
            f"({partners}), one message to each in the halving and one in the doubling: "
            f"2 lg p = {2 * len(partners)} messages")
    exact = len(set(sizes)) == 1  # p divides the length: the formula holds to the byte
    # else: the halving gives away all but one chunk, the doubling sends at most 2^k chunks
    most = costs.bytes_sent("halving_doubling", nbytes, 1, p, rank) if exact \
        else nbytes - min(sizes) + (p - 1) * max(sizes)
    if stats["bytes_sent"] > most:
        raise Mistake(
            f"with {case}: rank {rank} sent {stats['bytes_sent']} bytes, more than the "
            f"{'' if exact else 'at most '}{most} bytes of halving-doubling (2(p-1)/p·n, "
            f"n = {nbytes} bytes): in a halving round send only the half you give away, in a "
            f"doubling round only the range you hold complete{shape_hint}")


def check_halving_doubling_all_reduce(learner) -> str:
    _run_all(learner, "halving_doubling", _halving_doubling_traffic, POWERS_OF_TWO)
    return ("right sums on 1, 2, 4 and 8 ranks, 2 lg p messages and 2(p-1)/p·n bytes per "
            "rank, 1-D and 2-D")


TESTS = [
    GradedTest("test_naive_all_reduce", 2, ("naive_all_reduce",), check_naive_all_reduce,
               (COLLECTIVES,)),
    GradedTest("test_ring_reduce_scatter", 3, ("ring_reduce_scatter",),
               check_ring_reduce_scatter, (COLLECTIVES,)),
    GradedTest("test_ring_all_gather", 2, ("ring_all_gather",), check_ring_all_gather,
               (COLLECTIVES,)),
    GradedTest("test_ring_all_reduce", 3, ("ring_all_reduce",), check_ring_all_reduce,
               (COLLECTIVES,)),
    GradedTest("test_halving_doubling_all_reduce", 3, ("halving_doubling_all_reduce",),
               check_halving_doubling_all_reduce, (COLLECTIVES,), part="stretch"),
]
