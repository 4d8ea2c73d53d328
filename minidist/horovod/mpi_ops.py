"""Horovod's collectives (``horovod.torch.mpi_ops``, hence the name), on minidist's.

Each ``X_async`` queues a request on the background thread (``engine.py``) and returns a
handle; ``synchronize(handle)`` waits for it and returns the result; ``X`` is
``synchronize(X_async(...))``. ``X_`` works in place. The out-of-place forms are
differentiable, with Horovod's gradients: allreduce's is the allreduce of the gradient,
allgather's the average over ranks of this rank's rows, broadcast's the average on the root
(zero elsewhere), alltoall's the alltoall back (``horovod/torch/mpi_ops.py``).

Ops are Horovod's constants: ``Average`` (the default), ``Sum``, ``Min``, ``Max``,
``Product``; ``Adasum`` (Maleki et al. 2021) is not implemented and says so.
"""

from __future__ import annotations

import itertools
import warnings

import torch

from ..comm.tensors import DTYPE_CODE
from .context import context
from .engine import Request

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_MD_OP = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}
_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
          Product: "Product"}
_COUNTER = itertools.count()  # auto names, in call order: the same sequence on every rank


class NoneCompressor:
    """No compression: the tensor travels as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor:
    """Floating tensors travel as float16 (half the bytes) and come back in their dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor


def _md_op(op, average) -> str:
    if average is not None:
        warnings.warn("average= is deprecated in Horovod; use op=hvd.Average or hvd.Sum",
                      DeprecationWarning, stacklevel=3)
        if op is not None:
            raise ValueError("pass op= or the deprecated average=, not both")
        op = Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise NotImplementedError("op=hvd.Adasum (Maleki et al., 'Scaling distributed "
                                  "training with adaptive summation', MLSys 2021) is not "
                                  "implemented in minidist.horovod; use hvd.Average")
    if op not in _MD_OP:
        raise ValueError(f"unknown op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or "
                         "hvd.Product")
    return _MD_OP[op]


def _check_tensor(tensor, what: str, inplace: bool) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPE_CODE:
        raise TypeError(f"{what}: dtype {tensor.dtype} is not supported")
    if inplace and not tensor.is_contiguous():
        raise ValueError(f"{what}: the tensor must be contiguous to be reduced in place")
    return tensor


def _name(kind: str, name) -> str:
    if name is None:
        return f"{kind}.noname.{next(_COUNTER)}"
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return name


def _submit(request: Request) -> int:
    return context().engine.submit(request)


def synchronize(handle):
    """Wait for an ``_async`` call to finish and return its result."""
    return context().engine.synchronize(handle)


def poll(handle) -> bool:
    """Whether an ``_async`` call has finished (``synchronize`` will not wait)."""
    return context().engine.poll(handle)


# -- allreduce ---------------------------------------------------------------------------------
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0) -> int:
    """Start reducing ``tensor`` in place over all ranks; returns a handle."""
    md_op = _md_op(op, average)
    t = _check_tensor(tensor, "allreduce_", inplace=True).detach()
    return _submit(Request("allreduce", _name("allreduce", name), t, op=md_op,
                           prescale=float(prescale_factor), postscale=float(postscale_factor)))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0) -> int:
    """Start reducing a copy of ``tensor`` (left unchanged); returns a handle."""
    _check_tensor(tensor, "allreduce", inplace=False)
    return allreduce_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            average, name, op, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """Reduce ``tensor`` in place over all ranks (``op`` default ``Average``)."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, pre, post):
        ctx.args = (average, op, pre, post)
        return synchronize(allreduce_async(tensor, average, name, op, pre, post))

    @staticmethod
    def backward(ctx, grad):
        average, op, pre, post = ctx.args
        return synchronize(allreduce_async(grad, average, None, op, pre, post)), *[None] * 5


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over all ranks and return the result (``tensor`` unchanged);
    ``compression`` changes what travels (``Compression.fp16``)."""
    _md_op(op, average)  # fail here, before any autograd bookkeeping
    sent, cctx = compression.compress(tensor)
    out = _Allreduce.apply(sent, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


# -- allgather, broadcast, alltoall -------------------------------------------------------------
def _check_gather(tensor) -> torch.Tensor:
    t = _check_tensor(tensor, "allgather", inplace=False)
    if t.dim() == 0:
        raise ValueError("allgather: the tensor needs at least one dimension (it is "
                         "concatenated along dim 0); pass tensor.reshape(1)")
    return t


def allgather_async(tensor, name=None) -> int:
    """Start concatenating every rank's ``tensor`` along dim 0; returns a handle."""
    t = _check_gather(tensor)
    return _submit(Request("allgather", _name("allgather", name), t.detach().contiguous()))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows = tensor.shape[0]
        ctx.all_rows = synchronize(allgather_async(torch.tensor([ctx.rows]))).tolist()
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        averaged = synchronize(allreduce_async(grad.contiguous(), op=Average))
        start = sum(ctx.all_rows[: context().comm.rank])
        return averaged[start: start + ctx.rows], None


def allgather(tensor, name=None):
    """Every rank's ``tensor`` concatenated along dim 0 (first dimensions may differ)."""
    return _Allgather.apply(_check_gather(tensor), name)


def broadcast_async_(tensor, root_rank, name=None) -> int:
    """Start copying rank ``root_rank``'s ``tensor`` into ``tensor`` everywhere."""
    t = _check_tensor(tensor, "broadcast_", inplace=True).detach()
    return _submit(Request("broadcast", _name("broadcast", name), t,
                           root=_check_root(root_rank)))


def broadcast_async(tensor, root_rank, name=None) -> int:
    """Start a broadcast into a copy of ``tensor``; returns a handle."""
    _check_tensor(tensor, "broadcast", inplace=False)
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    """Copy rank ``root_rank``'s ``tensor`` into ``tensor`` on every rank, in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        averaged = synchronize(allreduce_async(grad.contiguous(), op=Average))
        mine = averaged if context().comm.rank == ctx.root else averaged.zero_()
        return mine, None, None


def broadcast(tensor, root_rank, name=None):
    """Rank ``root_rank``'s ``tensor`` on every rank, as a new tensor."""
    return _Broadcast.apply(tensor, root_rank, name)


def _check_root(root_rank) -> int:
    p = context().comm.world_size
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < p:
        raise ValueError(f"root_rank must be a rank in 0..{p - 1}, got {root_rank!r}")
    return root_rank


def alltoall_async(tensor, splits=None, name=None) -> int:
    """Start sending rows ``splits[j]`` of ``tensor`` to rank j (equal parts if None);
    ``synchronize`` gives ``(output, received_splits)``."""
    t = _check_tensor(tensor, "alltoall", inplace=False)
    p = context().comm.world_size
    if t.dim() == 0:
        raise ValueError("alltoall: the tensor needs at least one dimension")
    if splits is None:
        if t.shape[0] % p:
            raise ValueError(f"alltoall: {t.shape[0]} rows do not split equally over {p} "
                             "ranks; pass splits=")
        splits = torch.full((p,), t.shape[0] // p, dtype=torch.int64)
    splits = torch.as_tensor(splits).reshape(-1)
    if len(splits) != p or (splits < 0).any() or int(splits.sum()) != t.shape[0]:
        raise ValueError(f"alltoall: splits must be {p} non-negative row counts summing to "
                         f"{t.shape[0]}, got {splits.tolist()}")
    return _submit(Request("alltoall", _name("alltoall", name), t.detach().contiguous(),
                           splits=splits))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = synchronize(alltoall_async(tensor, splits, name))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _dead):
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received))
        return back, None, None


def alltoall(tensor, splits=None, name=None):
    """Rows ``splits[j]`` of ``tensor`` go to rank j; returns what arrived, concatenated in
    rank order, and (when ``splits`` is given) how many rows came from each rank."""
    out, received = _Alltoall.apply(tensor, splits, name)
    return out if splits is None else (out, received)


def join(device=-1) -> int:
    """This rank has no more data: take part in the others' allreduce, allgather and
    broadcast with neutral tensors until every rank has joined; returns the rank that
    joined last. ``device`` is accepted for Horovod's signature (tensors are CPU here)."""
    return synchronize(_submit(Request("join", "join")))


def barrier() -> None:
    """Wait until every rank has reached this call."""
    synchronize(_submit(Request("barrier", "barrier")))


def op_name(op) -> str:
    return _NAMES.get(op, repr(op))
