"""``ProcessGroupMinidist``: a torch.distributed process group whose every operation is a
minidist collective or message on a minidist Communicator.

What runs where:

* collectives run on the group's Communicator (the world one for the default group, so
  the local backend's shared-memory all-reduce applies), one at a time on the group's
  thread (``job_thread.py``), and return at once with a ``Work`` the thread completes;
* ``send``/``recv`` are minidist's own non-blocking ``isend``/``irecv`` on a copy of the
  communicator (``comm.split``), so torch's tags never meet anyone else's messages; their
  ``Work`` waits on the minidist request;
* a plugged-in ``all_reduce=f`` replaces the all-reduce (single and coalesced); it is
  called as ``f(comm, tensor, op=...)`` with a copy of the communicator of its own and
  minidist's op names (``"sum"``, ``"avg"``, ...);
* ``new_group`` and meshes: a ``comm.split`` of the parent's communicator.

Uneven ``all_to_all`` and uneven ``all_gather``/``reduce_scatter`` lists (torch allows
pieces of different sizes there) take a pairwise exchange, broadcasts or an all-reduce;
every other call maps onto the minidist collective of the same name (``collectives/``).
``call_counts`` records what torch asked for, by torch.distributed's function names.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from .. import collectives as coll
from ..comm import ANY_SOURCE
from . import torch_private
from .job_thread import GroupWorker
from .refusals import check_count, check_numel, check_same, check_single, check_tensors


class ProcessGroupMinidist(torch_private.TorchHooks):
    """A process group over ``comm``; ``all_reduce``: an optional replacement all-reduce."""

    def __init__(self, comm, all_reduce=None):
        super().__init__(comm.rank, comm.world_size)
        self.comm = comm
        self.call_counts: Counter = Counter()
        self._f = all_reduce
        self._p2p = comm.split(0)  # send/recv (user context) and pairwise all_to_all
        self._f_comm = comm.split(0) if all_reduce is not None else None
        self._worker = GroupWorker(f"minidist-pg-{comm.rank}")

    def __repr__(self) -> str:
        return (f"ProcessGroupMinidist(rank={self.comm.rank}, size={self.comm.world_size}, "
                f"all_reduce={getattr(self._f, '__name__', None)})")

    def _submit(self, call: str, job, result):
        self.call_counts[call] += 1
        return self._worker.submit(job, result)

    # -- reductions ---------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        call = "all_reduce"
        op = torch_private.reduce_op(opts or dist.AllreduceOptions(), call)
        check_tensors(call, tensors, reduce=True)
        return self._submit(call, lambda: [self._all_reduce(t, op) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        call = "all_reduce_coalesced"
        op = torch_private.reduce_op(opts or dist.AllreduceCoalescedOptions(), call)
        check_tensors(call, tensors, reduce=True)
        check_same(call, tensors)
        return self._submit(call, lambda: self._all_reduce_coalesced(tensors, op), tensors)

    def _all_reduce(self, t: torch.Tensor, op: str) -> None:
        x = t if t.is_contiguous() else t.contiguous()
        if self._f is not None:
            self._f(self._f_comm, x, op=op)
        else:
            coll.all_reduce(self.comm, x, op=op)
        if x is not t:
            t.copy_(x)

    def _all_reduce_coalesced(self, tensors, op: str) -> None:
        if self._f is None and all(t.is_contiguous() for t in tensors):
            coll.all_reduce_coalesced(self.comm, list(tensors), op=op)
            return
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)
        self._all_reduce(flat, op)
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(part.view(t.shape))

    def reduce(self, tensors, opts=None):
        call = "reduce"
        op = torch_private.reduce_op(opts, call)
        root = torch_private.root_rank(opts)
        check_single(call, tensors)
        check_tensors(call, tensors, reduce=True)
        return self._submit(call, lambda: _in_place(tensors[0], lambda x: coll.reduce(
            self.comm, x, dst=root, op=op)), tensors)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        call = "reduce_scatter"
        op = torch_private.reduce_op(opts or dist.ReduceScatterOptions(), call)
        check_single(call, outputs)
        pieces = input_lists[0]
        check_count(call, pieces, self.comm.world_size, "input tensors (one per rank)")
        check_tensors(call, [outputs[0], *pieces], reduce=True)
        check_same(call, [outputs[0], *pieces])
        return self._submit(call, lambda: self._reduce_scatter_list(outputs[0], pieces, op),
                            outputs)

    def _reduce_scatter_list(self, out, pieces, op: str) -> None:
        sizes = [t.numel() for t in pieces]
        if len(set(sizes)) == 1:  # the even case is minidist's ring reduce-scatter
            stacked = torch.stack([t.reshape(-1) for t in pieces])
            out.copy_(coll.reduce_scatter(self.comm, stacked, op=op).view(out.shape))
            return
        flat = torch.cat([t.reshape(-1) for t in pieces])  # uneven: every rank reduces all
        coll.all_reduce(self.comm, flat, op=op)
        start = sum(sizes[:self.comm.rank])
        out.copy_(flat[start:start + sizes[self.comm.rank]].view(out.shape))

    def _reduce_scatter_from(self, output, input, opts):  # noqa: A002 (torch's names)
        call = "reduce_scatter_tensor"
        op = torch_private.reduce_op(opts or dist.ReduceScatterOptions(), call)
        self._check_scatter_pair(call, output, input)
        return self._submit(call, lambda: self._reduce_scatter_one(output, input, op),
                            [output])

    def _reduce_scatter_from_coalesced(self, outputs, inputs, opts):
        call = "reduce_scatter_tensor_coalesced"
        op = torch_private.reduce_op(opts or dist.ReduceScatterOptions(), call)
        check_count(call, inputs, len(outputs), "inputs (one per output)")
        for output, input in zip(outputs, inputs):  # noqa: A001
            self._check_scatter_pair(call, output, input)
        return self._submit(call, lambda: [self._reduce_scatter_one(o, i, op)
                                           for o, i in zip(outputs, inputs)], outputs)

    def _check_scatter_pair(self, call, output, input) -> None:  # noqa: A002
        check_tensors(call, [output, input], reduce=True)
        check_same(call, [output, input])
        check_numel(call, input, output.numel() * self.comm.world_size,
                    "input (world_size times the output)")

    def _reduce_scatter_one(self, output, input, op: str) -> None:  # noqa: A002
        rows = input.reshape(self.comm.world_size, -1)
        output.copy_(coll.reduce_scatter(self.comm, rows.contiguous(), op=op).view(output.shape))

    # -- broadcast, gathers, scatter ----------------------------------------------------
    def broadcast(self, tensors, opts=None):
        call = "broadcast"
        root = torch_private.root_rank(opts or dist.BroadcastOptions())
        check_tensors(call, tensors)
        return self._submit(call, lambda: [_in_place(t, lambda x: coll.broadcast(
            self.comm, x, src=root)) for t in tensors], tensors)

    def allgather(self, output_lists, inputs, opts=None):
        call = "all_gather"
        check_single(call, inputs)
        check_count(call, output_lists[0], self.comm.world_size, "output tensors")
        check_tensors(call, [inputs[0], *output_lists[0]])
        check_same(call, [inputs[0], *output_lists[0]])
        return self._submit(call, lambda: self._all_gather_list(output_lists[0], inputs[0]),
                            output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """``output_lists[k][i]``: rank k's input i (torch's layout: one list per rank)."""
        call = "all_gather_coalesced"
        check_count(call, output_lists, self.comm.world_size, "output lists (one per rank)")
        for outs in output_lists:
            check_count(call, outs, len(inputs), "outputs per rank (one per input)")
        check_tensors(call, [*inputs, *(o for outs in output_lists for o in outs)])
        per_input = [[outs[i] for outs in output_lists] for i in range(len(inputs))]
        return self._submit(call, lambda: [self._all_gather_list(outs, x)
                                           for outs, x in zip(per_input, inputs)],
                            output_lists)

    def _all_gather_list(self, outs, x) -> None:
        if all(o.numel() == x.numel() for o in outs):
            stacked = coll.all_gather(self.comm, x.contiguous())
            for o, row in zip(outs, stacked):
                o.copy_(row.view(o.shape))
            return
        for r, o in enumerate(outs):  # uneven pieces: each rank broadcasts its own
            buf = x.contiguous().clone() if r == self.comm.rank else torch.empty(
                o.numel(), dtype=o.dtype, device=o.device)
            coll.broadcast(self.comm, buf.reshape(-1), src=r)
            o.copy_(buf.view(o.shape))

    def _allgather_into(self, output, input):  # noqa: A002
        call = "all_gather_into_tensor"
        self._check_gather_pair(call, output, input)
        return self._submit(call, lambda: self._all_gather_one(output, input), [output])

    def _allgather_into_coalesced(self, outputs, inputs):
        call = "all_gather_into_tensor_coalesced"
        check_count(call, inputs, len(outputs), "inputs (one per output)")
        for output, input in zip(outputs, inputs):  # noqa: A001
            self._check_gather_pair(call, output, input)
        return self._submit(call, lambda: [self._all_gather_one(o, i)
                                           for o, i in zip(outputs, inputs)], outputs)

    def _check_gather_pair(self, call, output, input) -> None:  # noqa: A002
        check_tensors(call, [output, input])
        check_same(call, [output, input])
        check_numel(call, output, input.numel() * self.comm.world_size,
                    "output (world_size times the input)")

    def _all_gather_one(self, output, input) -> None:  # noqa: A002
        output.copy_(coll.all_gather(self.comm, input.contiguous()).view(output.shape))

    def gather(self, output_lists, inputs, opts=None):
        call = "gather"
        root = torch_private.root_rank(opts)
        check_single(call, inputs)
        outs = output_lists[0] if self.comm.rank == root else []
        if self.comm.rank == root:
            check_count(call, outs, self.comm.world_size, "output tensors on the root")
        check_tensors(call, [inputs[0], *outs])
        return self._submit(call, lambda: self._gather(outs, inputs[0], root), output_lists)

    def _gather(self, outs, x, root: int) -> None:
        stacked = coll.gather(self.comm, x.contiguous(), dst=root)
        for o, row in zip(outs, stacked if stacked is not None else []):
            o.copy_(row.view(o.shape))

    def scatter(self, outputs, input_lists, opts=None):
        call = "scatter"
        root = torch_private.root_rank(opts)
        check_single(call, outputs)
        pieces = input_lists[0] if self.comm.rank == root else []
        if self.comm.rank == root:
            check_count(call, pieces, self.comm.world_size, "input tensors on the root")
        check_tensors(call, [outputs[0], *pieces])
        return self._submit(call, lambda: self._scatter(outputs[0], pieces, root), outputs)

    def _scatter(self, out, pieces, root: int) -> None:
        if self.comm.rank == root:
            stacked = torch.stack([t.reshape(out.shape) for t in pieces])
            out.copy_(coll.scatter(self.comm, stacked, src=root))
        else:
            _in_place(out, lambda x: x.copy_(coll.scatter(self.comm, x, src=root)))

    # -- all-to-all ---------------------------------------------------------------------
    def alltoall(self, outputs, inputs, opts=None):
        call = "all_to_all"
        p = self.comm.world_size
        check_count(call, outputs, p, "output tensors")
        check_count(call, inputs, p, "input tensors")
        check_tensors(call, [*outputs, *inputs])
        check_same(call, [*outputs, *inputs])
        return self._submit(call, lambda: self._pairwise(list(inputs), list(outputs)),
                            outputs)

    def _all_to_all_flat(self, output, input, output_splits, input_splits):  # noqa: A002
        call = "all_to_all_single"
        check_tensors(call, [output, input])
        check_same(call, [output, input])
        if not output_splits and not input_splits:
            check_numel(call, output, input.numel(), "output (as many as the input)")
            return self._submit(call, lambda: self._all_to_all_even(output, input), [output])
        send, recv = self._split_rows(call, input, input_splits), \
            self._split_rows(call, output, output_splits)
        return self._submit(call, lambda: self._pairwise(send, recv), [output])

    def _all_to_all_even(self, output, input) -> None:  # noqa: A002
        rows = input.reshape(self.comm.world_size, -1).contiguous()
        output.copy_(coll.all_to_all(self.comm, rows).view(output.shape))

    def _split_rows(self, call, t, splits):
        p = self.comm.world_size
        splits = list(splits) or [t.shape[0] // p if t.dim() else 0] * p
        check_count(call, splits, p, "split sizes")
        if t.dim() == 0 or sum(splits) != t.shape[0]:
            raise ValueError(f"minidist backend: {call}: split sizes {splits} do not add up "
                             f"to the first dimension of a tensor of shape {tuple(t.shape)}")
        return list(t.split(splits))

    def _pairwise(self, send, recv) -> None:
        """Step k: send to rank r + k, receive from rank r - k (deadlock-free; the
        pieces may differ in size), on a context no other traffic uses."""
        p, r, ch = self.comm.world_size, self.comm.rank, self._p2p.collective
        recv[r].copy_(send[r])
        for k in range(1, p):
            dst, src = (r + k) % p, (r - k) % p
            x = send[dst].contiguous()
            y = recv[src] if recv[src].is_contiguous() else torch.empty_like(recv[src])
            ch.sendrecv(x, dst, y, src)
            if y is not recv[src]:
                recv[src].copy_(y)

    # -- barrier, groups ----------------------------------------------------------------
    def barrier(self, opts=None):
        return self._submit("barrier", self.comm.barrier, None)

    def _split_group(self, ranks, group_name):
        """A sub-group over the given (default-group) ranks: a split of this group's
        communicator, run on its thread after whatever is queued."""
        self.call_counts["new_group"] += 1
        me = self.comm.rank
        color = 0 if me in ranks else None
        key = ranks.index(me) if me in ranks else 0
        sub = self._worker.run(lambda: self.comm.split(color, key))
        return None if sub is None else ProcessGroupMinidist(sub, all_reduce=self._f)

    def shutdown(self) -> None:
        self._worker.close()

    def abort(self) -> None:
        self._worker.close()

    # -- point to point -----------------------------------------------------------------
    def send(self, tensors, dst: int, tag: int):
        call = "send"
        check_single(call, tensors)
        check_tensors(call, tensors)
        self.call_counts[call] += 1
        x = tensors[0].detach().contiguous()
        return RequestWork(self._p2p.isend(x, dst, tag))

    def recv(self, tensors, src: int, tag: int):
        return self._irecv("recv", tensors, src, tag)

    def recv_anysource(self, tensors, tag: int):
        return self._irecv("recv_anysource", tensors, ANY_SOURCE, tag)

    def _irecv(self, call, tensors, src, tag):
        check_single(call, tensors)
        check_tensors(call, tensors)
        self.call_counts[call] += 1
        t = tensors[0].detach()  # received bytes are not part of any autograd graph
        y = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
        after = None if y is t else (lambda: t.copy_(y))
        return RequestWork(self._p2p.irecv(y, src, tag), after)


class RequestWork(dist.Work):
    """A torch Work over a minidist ``Request``: ``wait()`` waits on it; a receive knows its
    source after the wait (``recv`` from any source asks ``_source_rank()``)."""

    def __init__(self, request, after=None):
        super().__init__()
        self._request, self._after, self._source, self._done = request, after, None, False

    def wait(self, timeout=None) -> bool:
        if not self._done:
            self._source = self._request.wait()
            if self._after is not None:
                self._after()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._request.test()

    def is_success(self) -> bool:
        return self.is_completed()

    def _source_rank(self) -> int:
        self.wait()
        return -1 if self._source is None else int(self._source)

    def source_rank(self) -> int:
        return self._source_rank()


def _in_place(t: torch.Tensor, fn) -> torch.Tensor:
    """Run ``fn`` on ``t``, or on a contiguous copy that is copied back."""
    x = t if t.is_contiguous() else t.contiguous()
    fn(x)
    if x is not t:
        t.copy_(x)
    return t
