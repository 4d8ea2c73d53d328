"""The check that all ranks agree, before a collective moves any data.

 before moving any data, the ranks exchange a short description of the
call (collective, dtype, shape, op, algorithm, root). If they differ, every rank raises the
same ``CollectiveMismatchError`` listing what each rank passed, instead of one rank failing
on a wrongly sized message while the others wait forever, or worse, all of them reducing
misaligned data without noticing. The check travels as control traffic (like ``barrier``,
on the communicator's control context), so ``comm.stats`` counts only the algorithm's
payload and the byte formulas in the docstrings hold exactly. Cost: ceil(lg p) alpha.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..comm import tensors
from ..errors import CollectiveMismatchError

_DESC_BYTES = 128
_CHECK_TAG = -1000  # on the control context, apart from barrier's and split's tags


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
    """Raise ``CollectiveMismatchError`` on every rank unless every rank passed ``desc``.

    On a local-backend world communicator: one barrier in shared memory that carries the
    hashes (``collectives/shared_memory.same_everywhere``). Elsewhere: a dissemination
    all-reduce (Hensgen, Finkel and Manber 1988) of (h, -h), h a
    hash of ``desc``, under max: ceil(lg p) rounds of one 16-byte message; max works even
    though the rounds overlap. Every rank then holds max(h) and -min(h), equal only if all
    hashes are. Only on a mismatch do the ranks exchange the full descriptions, to say who
    passed what.
    """
    from . import shared_memory as shm_collectives  # here: it imports this module

    p = comm.world_size
    if p == 1:
        return
    h = int.from_bytes(hashlib.blake2b(desc.encode(), digest_size=7).digest(), "little")
    if shm_collectives.world_ok(comm):  # one barrier in shared memory, no messages
        if not shm_collectives.same_everywhere(comm, h):
            _raise_mismatch(comm, desc)
        return
    mine, got, k = np.array([h, -h], dtype=np.int64), np.empty(2, dtype=np.int64), 1
    while k < p:  # control traffic on the communicator's control context: not in stats
        req = comm._irecv(got, (comm.rank - k) % p, _CHECK_TAG, comm._ctx + 1, count=False)
        comm._isend(mine, (comm.rank + k) % p, _CHECK_TAG, comm._ctx + 1,
                    count=False).wait(op="collective check")
        req.wait(op="collective check")
        np.maximum(mine, got, out=mine)
        k <<= 1
    if mine[0] != -mine[1]:
        _raise_mismatch(comm, desc)


def _raise_mismatch(comm, desc: str):
    """Every rank has seen the mismatch: exchange the descriptions and say who passed what."""
    table = comm._allgather_ints(_encode(desc))
    raise CollectiveMismatchError(_mismatch_text(comm.rank, [_decode(r) for r in table]))


def _encode(desc: str) -> list[int]:
    raw = desc.encode()
    if len(raw) > _DESC_BYTES:  # keep it readable and still exact: cut, and add a hash
        digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
        raw = raw[:_DESC_BYTES - 20] + b"...#" + digest.encode()
    return np.frombuffer(raw.ljust(_DESC_BYTES, b"\0"), dtype="<i8").tolist()


def _decode(row: list[int]) -> str:
    return np.asarray(row, dtype="<i8").tobytes().rstrip(b"\0").decode(errors="replace")


def _mismatch_text(rank: int, descs: list[str]) -> str:
    groups: dict[str, list[int]] = {}
    for r, d in enumerate(descs):
        groups.setdefault(d, []).append(r)
    lines = [f"  rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {d}"
             for d, rs in groups.items()]
    return (f"rank {rank}: the ranks called a collective with different arguments; every rank "
            "must call the same collective with the same dtype, shape, op, algorithm and "
            "root:\n" + "\n".join(lines))
