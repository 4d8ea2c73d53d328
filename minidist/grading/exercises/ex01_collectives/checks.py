"""Exercise 01's tests: every rank's result against the sum of every rank's data, then the
bytes and messages each rank sent against the algorithm's formula."""

from __future__ import annotations

import torch

from ...engine.compare import compare
from ...engine.data import pattern
from ...engine.feedback import Mistake, traffic_text
from .mistakes import HINTS, mean_hint, not_in_place_hint, replaced_hint, shape_hint, whose
from .ranks import KINDS, POWERS_OF_TWO, WORLD_SIZES, case, expected, label


def _run_all(learner, kind, expected_bytes, world_sizes=WORLD_SIZES) -> None:
    name, cases = KINDS[kind]
    worlds = {p: [(kind, n, d) for n, d in cases] for p in world_sizes}
    for p, (_, n, dtype), where, results in learner.each_world(case, name, worlds, label):
        numel = pattern(0, n, dtype, p).numel()
        sizes = [c.numel() * dtype.itemsize for c in torch.empty(numel).tensor_split(p)]
        for rank, result in enumerate(results):
            (got, replaced), traffic = result["value"], result["traffic"]
            want = expected(kind, rank, n, dtype, p)
            problem = compare(got, want, f"rank {rank}")
            if problem:
                offset = sum(sizes[:rank]) // dtype.itemsize if kind == "reduce_scatter" else 0
                why = replaced_hint(replaced) or not_in_place_hint(got, kind, rank, n, dtype, p) \
                    or mean_hint(got, want, p) or whose(got, want, offset, p)
                raise Mistake(f"with {where}: {problem}{why}{HINTS[kind]}")
            expected_bytes(rank, p, numel * dtype.itemsize, sizes, traffic, where,
                           shape_hint(n, p))
        _judge_total(kind, [r["traffic"]["bytes_sent"] for r in results],
                     numel * dtype.itemsize, where)


# Bytes all ranks send together, in units of (p-1)·n, whatever the chunking: every algorithm
# here moves each chunk p-1 times per phase (halving-doubling too: each round's pairs swap
# exactly the range they share, so every round moves n/2 per pair-level, (p-1)·n in all).
PHASES = {"naive": 2, "reduce_scatter": 1, "all_gather": 1, "ring_all_reduce": 2,
          "halving_doubling": 2}


def _judge_total(kind: str, sent: list[int], nbytes: int, where: str) -> None:
    p = len(sent)
    want = PHASES[kind] * (p - 1) * nbytes
    if sum(sent) != want:
        raise Mistake(f"with {where}: the ranks sent {sum(sent)} bytes in all "
                      f"({', '.join(map(str, sent))}), where the algorithm moves exactly "
                      f"{PHASES[kind]}(p-1)·n = {want}{_ELSEWHERE}")


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
# Counts are exact, not bounds: a rank that sends less than its algorithm's share got its data
# some other way (a file, shared memory), and loses the points as one that sends too much.
_ELSEWHERE = ("; a rank that sends fewer bytes than the algorithm got its data some other way "
              "(a file, shared memory): every byte must travel in comm's messages")


def _ring_bytes(phase: str, skip: int):
    """Bytes check for a ring phase: rank r sends every chunk but chunk (r + skip) % p, one
    message per step, p - 1 steps (a step whose chunk is empty may send nothing)."""
    def check(rank, p, nbytes, sizes, stats, case, shape_hint) -> None:
        want = nbytes - sizes[(rank + skip) % p] if p > 1 else 0
        right = (rank + 1) % p
        messages = stats["messages_to"].get(right, 0)
        steps_ok = messages == p - 1 or (min(sizes) == 0 and messages <= p - 1)
        if stats["bytes_sent"] != want or not _only_to(stats, right) or \
                (p > 1 and not steps_ok):
            raise Mistake(
                f"with {case}: rank {rank} sent {traffic_text(stats)}; a ring {phase} sends "
                f"(p-1)/p·n = {want} bytes here, exactly, one chunk per step (p-1 = {p - 1} "
                f"message(s)), only to its right neighbour rank {right}"
                f"{_ELSEWHERE if stats['bytes_sent'] < want else ''}")
    return check


def _all_reduce_bytes(rank, p, nbytes, sizes, stats, case, shape_hint) -> None:
    """A ring all_reduce: a reduce-scatter and an all-gather, each leaving out one chunk:
    2n minus two neighbouring chunks, whichever chunk a rank starts with."""
    right = (rank + 1) % p
    if p > 1 and not _only_to(stats, right):
        raise Mistake(f"with {case}: rank {rank} sent {_traffic(stats)}; in a ring every "
                      f"rank sends only to its right neighbour, rank {right}")
    allowed = {2 * nbytes - sizes[j] - sizes[(j + 1) % p] for j in range(p)} if p > 1 else {0}
    want = 2 * nbytes - sizes[rank] - sizes[right] if p > 1 else 0
    messages = stats["messages_to"].get(right, 0)
    steps_ok = p == 1 or messages == 2 * (p - 1) or (min(sizes) == 0 and
                                                     messages <= 2 * (p - 1))
    if stats["bytes_sent"] not in allowed:
        more = stats["bytes_sent"] > max(allowed)
        raise Mistake(
            f"with {case}: rank {rank} sent {stats['bytes_sent']} bytes, "
            f"{'more' if more else 'fewer'} than the 2(p-1)/p·n = {want} bytes (exactly) of a "
            f"ring all_reduce (n = {nbytes} bytes): a reduce-scatter then an all-gather, each "
            "sending one chunk per step, the chunks as equal as they can be"
            f"{shape_hint}{'' if more else _ELSEWHERE}")
    if not steps_ok:
        raise Mistake(f"with {case}: rank {rank} sent {traffic_text(stats)}; a ring "
                      f"all_reduce sends one chunk per step, 2(p-1) = {2 * (p - 1)} messages")


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
    most = 2 * (p - 1) * nbytes // p if exact else nbytes - min(sizes) + (p - 1) * max(sizes)
    if stats["bytes_sent"] > most or (exact and stats["bytes_sent"] != most):
        raise Mistake(
            f"with {case}: rank {rank} sent {stats['bytes_sent']} bytes, "
            f"{'more' if stats['bytes_sent'] > most else 'fewer'} than the "
            f"{'' if exact else 'at most '}{most} bytes of halving-doubling (2(p-1)/p·n, "
            f"n = {nbytes} bytes): in a halving round send only the half you give away, in a "
            f"doubling round only the range you hold complete{shape_hint}")


def check_halving_doubling_all_reduce(learner) -> str:
    _run_all(learner, "halving_doubling", _halving_doubling_traffic, POWERS_OF_TWO)
    return ("right sums on 1, 2, 4 and 8 ranks, 2 lg p messages and 2(p-1)/p·n bytes per "
            "rank, 1-D and 2-D")
