"""The background thread that runs Horovod's collectives: handles, negotiation, ``join``.

Horovod (Sergeev and Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", 2018, section 4) queues every collective and has one background thread per
process run them, so ``allreduce_async`` returns at once and backward goes on computing.
Its coordinator matches the ranks' requests *by name*, in whatever order they came. Here
one thread per process runs the requests *in the order they were submitted* (so every
rank must submit the same collectives in the same order, which autograd's hooks do) and
each request starts with a negotiation: every rank's short descriptor (kind, name, dtype,
shape, op, root, joined) travels in one ``md.all_gather``. That check is what makes a
mismatch an error that names both names instead of a silent reduction of the wrong
tensors, and it is how a rank inside ``join()`` learns what the others are reducing, so it
can take part with a neutral tensor, as Horovod's joined ranks do.

Horovod's Tensor Fusion (packing small tensors into one buffer) is not implemented: one
collective per request.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from .. import collectives as C
from ..comm.tensors import CODE_DTYPE, DTYPE_CODE
from ..errors import MinidistError

KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "join", "barrier")
OPS = ("avg", "sum", "min", "max", "prod")  # md's names, indexed by the descriptor's op code
# descriptor fields, one int64 each
KIND, JOINED, JOIN_ROUND, NAME, DTYPE, OP, ROOT, NDIM, ROWS, REST, SHAPE = range(11)
WIDTH = 11


class HorovodInternalError(MinidistError):
    """A collective failed on the background thread, or the ranks submitted different
    collectives at the same point (Horovod's ``HorovodInternalError``)."""


@dataclass
class Request:
    """One collective. ``tensor`` is reduced in place where ``inplace``, else a copy is."""

    kind: str
    name: str
    tensor: torch.Tensor | None = None
    op: str = "avg"
    root: int = 0
    splits: torch.Tensor | None = None
    prescale: float = 1.0
    postscale: float = 1.0
    joined_round: int = -1
    meta: dict = field(default_factory=dict)

    def descriptor(self, round_: int) -> torch.Tensor:
        d = torch.zeros(WIDTH, dtype=torch.int64)
        d[KIND], d[NAME] = KINDS.index(self.kind), name_hash(self.name)
        d[JOINED], d[JOIN_ROUND] = int(self.kind == "join"), self.joined_round
        if self.tensor is not None:
            t = self.tensor
            d[DTYPE], d[NDIM] = DTYPE_CODE[t.dtype], t.dim()
            d[ROWS] = t.shape[0] if t.dim() else 1
            d[REST] = _rest_numel(t)
            d[SHAPE] = name_hash(repr(tuple(t.shape[1:]) if t.dim() else ()))
        d[OP], d[ROOT] = OPS.index(self.op), self.root
        return d


def name_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


def _rest_numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


class Engine:
    """One background thread over ``comm``: ``submit`` returns a handle (an int, as in
    Horovod), ``poll(handle)`` says whether it is done, ``synchronize(handle)`` waits and
    returns the result (or raises what the thread raised)."""

    def __init__(self, comm):
        self.comm = comm
        self.rounds = 0  # negotiations so far: the same count on every rank
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[int, Future] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="minidist-horovod", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> int:
        if not self._thread.is_alive():
            raise HorovodInternalError("minidist.horovod has been shut down; call hvd.init()")
        fut: Future = Future()
        with self._lock:
            handle, self._next = self._next, self._next + 1
            self._futures[handle] = fut
        self._queue.put((request, fut))
        return handle

    def poll(self, handle: int) -> bool:
        return self._future(handle).done()

    def synchronize(self, handle: int):
        fut = self._future(handle)
        try:
            return fut.result()
        finally:
            with self._lock:
                self._futures.pop(handle, None)

    def _future(self, handle) -> Future:
        with self._lock:
            fut = self._futures.get(handle)
        if fut is None:
            raise ValueError(f"unknown handle {handle!r}: it was never returned by an _async "
                             "call, or synchronize() already consumed it")
        return fut

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put((None, None))
            self._thread.join()

    def _run(self) -> None:
        while True:
            request, fut = self._queue.get()
            if request is None:
                return
            try:
                with torch.no_grad():  # grad mode is per thread; ours reduces detached data
                    fut.set_result(self._execute(request))
            except BaseException as e:  # handed to whoever synchronizes
                fut.set_exception(e)

    # -- on the background thread ------------------------------------------------------------
    def _negotiate(self, request: Request) -> torch.Tensor:
        """Every rank's descriptor, by rank: shape (p, WIDTH)."""
        self.rounds += 1
        return C.all_gather(self.comm, request.descriptor(self.rounds))

    def _execute(self, request: Request):
        if request.kind == "join":
            return self._join(request)
        descs = self._negotiate(request)
        check_descriptors(descs, request, self.comm)
        return run_collective(self.comm, request, descs)

    def _join(self, request: Request) -> int:
        """Take part in the others' collectives with neutral tensors until every rank has
        joined; return the rank that joined last (the highest such rank on a tie)."""
        request.joined_round = self.rounds + 1
        while True:
            descs = self._negotiate(request)
            active = [r for r in range(len(descs)) if not descs[r, JOINED]]
            if not active:
                rounds = descs[:, JOIN_ROUND]
                return max(r for r in range(len(descs)) if rounds[r] == rounds.max())
            check_descriptors(descs, request, self.comm)
            run_collective(self.comm, neutral_request(descs[active[0]]), descs)


def check_descriptors(descs: torch.Tensor, mine: Request, comm) -> None:
    """The same verdict on every rank (they all hold the same ``descs``): the ranks that
    have not joined must have submitted the same collective."""
    active = [r for r in range(len(descs)) if not descs[r, JOINED]]
    fields = [KIND, NAME, DTYPE, OP, ROOT, NDIM, SHAPE]
    if KINDS[int(descs[active[0], KIND])] in ("allreduce", "broadcast"):
        fields.append(ROWS)
    first = descs[active[0]]
    for r in active[1:]:
        differ = [f for f in fields if descs[r, f] != first[f]]
        if differ:
            raise HorovodInternalError(_mismatch(descs, active[0], r, differ, mine, comm.rank))
    kind = KINDS[int(first[KIND])]
    joined = [r for r in range(len(descs)) if descs[r, JOINED]]
    if joined and kind not in ("allreduce", "allgather", "broadcast", "barrier"):
        raise HorovodInternalError(f"{kind} while rank(s) {joined} have joined: a joined rank "
                                   "takes part only in allreduce, allgather and broadcast")
    if joined and kind == "broadcast" and int(first[ROOT]) in joined:
        raise HorovodInternalError(f"broadcast from root rank {int(first[ROOT])}, which has "
                                   "joined and has nothing to send")


def _mismatch(descs, a: int, b: int, differ: list[int], mine: Request, me: int) -> str:
    names = {KIND: "collective", NAME: "name", DTYPE: "dtype", OP: "op", ROOT: "root rank",
             NDIM: "number of dimensions", SHAPE: "shape", ROWS: "shape"}

    def show(r: int) -> str:
        d = descs[r]
        what = f"{KINDS[int(d[KIND])]}, dtype {CODE_DTYPE[int(d[DTYPE])]}".replace("torch.", "")
        if r == me:
            what += f", name {mine.name!r}"
        return what

    return (f"ranks {a} and {b} submitted different collectives at the same point (their "
            f"{', '.join(sorted({names[f] for f in differ}))} differ; rank {a}: {show(a)}; "
            f"rank {b}: {show(b)}; this is rank {me}). Horovod matches collectives by name; "
            "minidist.horovod runs them in submission order, so every rank must submit the "
            "same collectives, with the same names, in the same order")


def neutral_request(desc: torch.Tensor) -> Request:
    """What a joined rank contributes to a collective described by ``desc``: the op's
    identity for allreduce (zeros for sum and average, as in Horovod), no rows for
    allgather, a receive buffer for broadcast."""
    kind, op = KINDS[int(desc[KIND])], OPS[int(desc[OP])]
    dtype, rows, rest = CODE_DTYPE[int(desc[DTYPE])], int(desc[ROWS]), int(desc[REST])
    if kind == "allgather":
        t = torch.empty((0, rest), dtype=dtype)
    elif kind in ("allreduce", "broadcast"):
        t = torch.full((rows * rest,), _identity(op, dtype), dtype=dtype)
    else:
        t = None
    return Request(kind, "join.neutral", t, op=op, root=int(desc[ROOT]))


def _identity(op: str, dtype: torch.dtype):
    if op in ("sum", "avg"):
        return 0
    if op == "prod":
        return 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.max if op == "min" else info.min


def run_collective(comm, request: Request, descs: torch.Tensor):
    """The collective itself, with every rank's descriptor in hand."""
    kind = request.kind
    if kind == "barrier":
        return None
    if kind == "allreduce":
        return _allreduce(comm, request)
    if kind == "broadcast":
        flat = request.tensor.reshape(-1)
        C.broadcast(comm, flat, src=request.root)
        return request.tensor
    if kind == "allgather":
        return _allgather(comm, request.tensor, descs[:, ROWS].tolist())
    return _alltoall(comm, request)


def _allreduce(comm, request: Request) -> torch.Tensor:
    t = request.tensor
    if request.prescale != 1.0:
        t.mul_(request.prescale)
    C.all_reduce(comm, t.reshape(-1), op=request.op)
    if request.postscale != 1.0:
        t.mul_(request.postscale)
    return t


def _allgather(comm, t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Concatenate every rank's ``t`` along dim 0 (the first dimensions may differ): pad to
    the longest, one ``md.all_gather``, cut the padding off."""
    rest_shape = t.shape[1:]
    flat = t.reshape(t.shape[0] if t.dim() else 1, _rest_numel(t))
    padded = torch.zeros((max(rows), flat.shape[1]), dtype=t.dtype)
    padded[: flat.shape[0]] = flat
    got = C.all_gather(comm, padded)
    out = torch.cat([got[r, :n] for r, n in enumerate(rows)])
    return out.reshape(sum(rows), *rest_shape)


def _alltoall(comm, request: Request):
    """Rank r sends rows ``splits[j]`` of its tensor to rank j. Every rank's splits in one
    all_gather (the matrix says what each receives), then one padded ``md.all_to_all``."""
    t, p = request.tensor, comm.world_size
    splits = request.splits.to(torch.int64)
    matrix = C.all_gather(comm, splits)  # matrix[i, j]: rows rank i sends to rank j
    width = int(matrix.max()) if matrix.numel() else 0
    flat = t.reshape(t.shape[0], _rest_numel(t))
    send = torch.zeros((p, width, flat.shape[1]), dtype=t.dtype)
    for j, piece in enumerate(flat.split(splits.tolist())):
        send[j, : piece.shape[0]] = piece
    got = C.all_to_all(comm, send)
    received = matrix[:, comm.rank]
    out = torch.cat([got[i, : int(n)] for i, n in enumerate(received)])
    return out.reshape(int(received.sum()), *t.shape[1:]), received.to(torch.int32)
