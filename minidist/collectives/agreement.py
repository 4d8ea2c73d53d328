"""The check that all ranks agree, before a collective moves any data.

Before moving any data, the ranks exchange a short description of the
call (collective, dtype, shape, op, algorithm, root). If they differ, every rank raises the
same ``CollectiveMismatchError`` listing what each rank passed, instead of one rank failing
on a wrongly sized message while the others wait forever, or worse, all of them reducing
misaligned data without noticing. The check travels on a channel of its own (``Ch.CHECK``,
``comm/contexts.py``), so ``comm.stats`` counts only the algorithm's payload and the byte
formulas in the docstrings hold exactly. Cost: ceil(lg p) alpha on a real network; none
on virtual time, which models what NCCL or gloo would take, and they make no such check.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..comm import tensors
from ..comm.contexts import Ch
from ..errors import CollectiveMismatchError
from . import shared_memory

_CHECK_TAG = -1000


def describe(name: str, t, shape=None, **params) -> str:
    """A short text that names this rank's call, e.g. ``all_reduce(float32[10], op='sum')``.

    Never raises, so that even a rank passing something unusable takes part in the check.
    ``shape`` overrides the tensor's shape (scatter's root describes one piece).
    """
    try:
        x = tensors.as_tensor(t, "tensor")
        dims = tuple(x.shape) if shape is None else tuple(shape)
        what = f"{tensors.dtype_name(tensors.DTYPE_CODE[x.dtype])}[{', '.join(map(str, dims))}]"
    except (TypeError, ValueError) as e:
        what = f"<{type(t).__name__}: {str(e)[:40]}>"
    args = "".join(f", {k}={v!r}" for k, v in params.items())
    return f"{name}({what}{args})"


def agree(comm, desc: str) -> None:
    """Raise ``CollectiveMismatchError`` on every rank unless every rank passed ``desc``."""
    texts = disagreement(comm, desc, op=f"collective check of {desc}")
    if texts is not None:
        raise CollectiveMismatchError(_mismatch_text(comm.rank, texts))


def disagreement(comm, text: str, op: str = "agreement check") -> list[str] | None:
    """None on every rank if every rank passed the same ``text``; otherwise every rank's
    text, by rank, on every rank. The one "the ranks must agree" mechanism: collectives
    (``agree``), DDP (same model everywhere) and the sampler (same dataset and seed) use it,
    each saying in its own words what differs.

    On a world communicator with a shared scratch area: one barrier in shared memory that
    carries the hashes (``shared_memory.same_everywhere``). Elsewhere: a dissemination
    all-reduce (Hensgen, Finkel and Manber 1988) of (h, -h), h a hash of ``text``, under
    max: ceil(lg p) rounds of one 16-byte message; max works even though the rounds overlap.
    Every rank then holds max(h) and -min(h), equal only if all hashes are. Only on a
    mismatch do the ranks exchange the full texts. All of it on the CHECK channel, so
    ``comm.stats`` counts only payload. Cost: ceil(lg p) alpha (none on virtual time).
    """
    if comm.world_size == 1:
        return None
    h = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
    if shared_memory.world_ok(comm):  # one barrier in shared memory, no messages
        same = shared_memory.same_everywhere(comm, h, op)
    else:
        same = _same_hash(comm, h, op)
    return None if same else _all_texts(comm, text, op)


def _same_hash(comm, h: int, op: str) -> bool:
    p, control = comm.world_size, comm.channel(Ch.CHECK)
    mine, got, k = np.array([h, -h], dtype=np.int64), np.empty(2, dtype=np.int64), 1
    while k < p:
        req = control.irecv(got, (comm.rank - k) % p, _CHECK_TAG)
        control.isend(mine, (comm.rank + k) % p, _CHECK_TAG).wait(op=op)
        req.wait(op=op)
        np.maximum(mine, got, out=mine)
        k <<= 1
    return bool(mine[0] == -mine[1])


def _all_texts(comm, text: str, op: str) -> list[str]:
    """Every rank's text: lengths first, then the texts padded to the longest."""
    raw = text.encode()
    check = comm.channel(Ch.CHECK)
    lengths = [row[0] for row in check.all_gather_ints([len(raw)], op=op)]
    words = (max(lengths) + 7) // 8
    rows = check.all_gather_ints(
        np.frombuffer(raw.ljust(words * 8, b"\0"), dtype="<i8").tolist(), op=op)
    return [np.asarray(row, dtype="<i8").tobytes()[:n].decode(errors="replace")
            for row, n in zip(rows, lengths)]


def _mismatch_text(rank: int, descs: list[str]) -> str:
    groups: dict[str, list[int]] = {}
    for r, d in enumerate(descs):
        groups.setdefault(d, []).append(r)
    lines = [f"  rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {d}"
             for d, rs in groups.items()]
    return (f"rank {rank}: the ranks called a collective with different arguments; every rank "
            "must call the same collective with the same dtype, shape, op, algorithm and "
            "root:\n" + "\n".join(lines))
