"""What exercise 01's feedback adds to a wrong value: which ranks' data it holds (the test
data makes every sum decodable), how each algorithm moves its chunks, and why a 2-D tensor
must be cut flat."""

from __future__ import annotations

import torch

from ...engine.data import contributors, pattern
from .ranks import IN_PLACE

HINTS = {  # kind: how the algorithm works, said after any wrong value
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


def shape_hint(n, p) -> str:
    if isinstance(n, int):
        return ""
    return (f". t has shape {tuple(n)}: t.tensor_split(p) cuts its rows, and {n[0]} rows "
            f"cannot be shared fairly by {p} ranks; cut the flattened tensor instead "
            "(t.view(-1) is a view of t, and so are its chunks)")


def whose(got, want, offset, p) -> str:
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


def replaced_hint(replaced) -> str:
    """A reduce-scatter or all-gather that put new tensors in the list instead of writing
    the chunks it was given (views of the caller's t: ring_all_reduce relies on it)."""
    if not replaced:
        return ""
    return (f"; chunks[{replaced[0]}] was replaced by a new tensor, so the caller's tensor "
            "never got it: the chunks are views of the caller's t (ring_all_reduce passes "
            "views of t), write into them in place (+=, copy_, or receive straight into them)")


def not_in_place_hint(got, kind, rank, n, dtype, p) -> str:
    """A rank whose t still holds its own data: the result went into a new tensor."""
    if kind not in IN_PLACE or p == 1 or not isinstance(got, torch.Tensor):
        return ""
    own = pattern(rank, n, dtype, p)
    if got.shape != own.shape or not torch.equal(got, own):
        return ""
    return (f"; rank {rank}'s t still holds its own data: work in place (t += buf, "
            "comm.recv(t, src), t.copy_(total)); t = t + buf makes a new tensor, and the "
            "caller's t never sees it")


def mean_hint(got, want, p) -> str:
    """The mean instead of the sum."""
    if p == 1 or not isinstance(got, torch.Tensor) or got.shape != want.shape or \
            not got.is_floating_point() or not want.any():
        return ""
    if not torch.allclose(got.double() * p, want.double(), rtol=1e-5, atol=1e-6):
        return ""
    return (f"; that is the mean over the {p} ranks: this all_reduce sums (dividing by the "
            "world size is the caller's step, as in data parallelism)")
