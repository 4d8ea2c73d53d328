"""Gradient buckets and the Reducer behind ``DistributedDataParallel``.

This is the machinery of PyTorch DDP as Li et al. describe it ("PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", VLDB 2020, sections 3.2 and 4.2):

* Buckets. One all-reduce per parameter pays the latency (alpha) hundreds of times; one
  all-reduce of everything cannot start before the whole backward pass is over. DDP packs
  gradients into buckets of about ``bucket_cap_mb`` and reduces bucket by bucket. Parameters
  go into buckets in *reverse* registration order, because backward produces the gradients
  of the last layers first. A bucket holds one dtype (one flat buffer).
* Hooks. An autograd hook on every parameter fires when its gradient has been accumulated.
  With a comm hook (or 16-bit gradients) it copies the gradient into its bucket slot,
  dividing by the world size on the way so the all-reduce only sums, as torch does; by
  default the gradient stays where it is and the bucket is averaged in place by one
  ``all_reduce_coalesced``, which on the local backend reads and writes ``param.grad``
  through shared memory and so skips the two copies (in and out of the bucket). When the
  bucket's last gradient is in, the hook starts that bucket's all-reduce while backward
  goes on computing earlier layers.
  Buckets are started strictly in index order, so every rank issues the same sequence of
  collectives even if its hooks fire in a different order.
* Overlap. A collective here is a sequence of blocking sends and receives, so "start" means
  "hand it to a communication thread", just as a torch ProcessGroup runs its work on worker
  threads. At the end of backward (an autograd-engine callback) the Reducer waits for every
  bucket and writes the averaged gradients back into ``param.grad``. Overlap hides
  communication only where it does not need the cores backward is using (on GPUs the copy
  engines and the network do it); with as many ranks as cores, the thread's copies and
  backward's arithmetic take turns, and overlap gains little.
* Unused parameters. A parameter that got no gradient would keep its bucket from ever being
  ready. With ``find_unused_parameters=True`` the forward pass walks the autograd graph, and
  the parameters it does not reach count as ready (their slot holds their current gradient,
  or zeros); afterwards one small all-reduce says which were unused on *every* rank, and those
  keep their ``.grad`` untouched, as in PyTorch. Without it, a missing gradient is an error
  that names the parameters and the fix.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import torch
from torch import nn

from ...collectives import all_reduce, all_reduce_coalesced
from .buckets import Bucket, allreduce_hook, assign_buckets  # noqa: F401 (re-exported)

_COALESCE_DTYPES = (torch.float32, torch.float64)


class CommThread:
    """A single background thread that runs submitted functions in order (FIFO), so that
    collectives are issued in the same order on every rank while the caller computes."""

    def __init__(self, name: str = "minidist-ddp-comm"):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn) -> Future:
        if self._thread is None or not self._thread.is_alive():
            # a daemon: a rank that fails mid-step must still be able to exit
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        fut: Future = Future()
        self._queue.put((fn, fut))
        return fut

    def _run(self) -> None:
        while True:
            fn, fut = self._queue.get()
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to whoever waits on the future
                fut.set_exception(e)


class Reducer:
    """Buckets a module's gradients and averages them across ranks during backward.

    ``DistributedDataParallel`` drives it: ``prepare(outputs, sync)`` after each forward pass,
    then the autograd hooks and the end-of-backward callback do the rest."""

    def __init__(self, comm, named_params: list[tuple[str, nn.Parameter]], cap_bytes: float,
                 overlap: bool = True, find_unused: bool = False, as_view: bool = False,
                 hook=None, algorithm: str = "auto"):
        self.comm, self.overlap, self.find_unused = comm, overlap, find_unused
        self.as_view, self.hook, self.algorithm = as_view, hook, algorithm
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.buckets = [Bucket(b, [self.params[i] for i in idx], [self.names[i] for i in idx],
                               idx) for b, idx in enumerate(assign_buckets(self.params, cap_bytes))]
        self.where = {i: (b, k) for b in self.buckets for k, i in enumerate(b.members)}
        self.thread = CommThread()
        self.used = [False] * len(self.params)  # got a gradient since the last sync
        self.expect_sync = False
        self.unused: list[int] = []
        self.stats: dict = {"comm_s": 0.0, "wait_s": 0.0, "buckets": len(self.buckets),
                            "pending_at_launch": []}
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(
            lambda _p, i=i: self._on_grad(i)) for i, p in enumerate(self.params)]

    def _reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.pending = [len(b.params) for b in self.buckets]
        self.next_bucket = 0
        self.futures: list[Future] = []
        self.pending_at_launch: list[int] = []  # gradients still missing at each launch
        self.armed = False

    # -- forward side -------------------------------------------------------------------------
    def prepare(self, outputs, sync: bool) -> None:
        """Called after each forward: will the coming backward synchronize, and (with
        ``find_unused``) which parameters can get no gradient from ``outputs``."""
        self.expect_sync = sync
        if sync and self.find_unused:
            reached = reachable_params(outputs)
            self.unused = [i for i, p in enumerate(self.params) if id(p) not in reached]

    # -- backward side: hooks -----------------------------------------------------------------
    def _on_grad(self, i: int) -> None:
        self.used[i] = True
        if not self.expect_sync:  # inside no_sync(): gradients just accumulate in .grad
            return
        if not self.armed:
            self._arm()
        self._mark_ready(i)

    def _arm(self) -> None:
        """First hook of a synchronizing backward: schedule the finalizer, and count the
        parameters the forward pass did not reach as ready."""
        self.armed = True
        torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
        for j in self.unused:
            self._mark_ready(j)

    def _mark_ready(self, i: int) -> None:
        if self.ready[i]:
            self._drain()
            self._end_pass()
            raise RuntimeError(
                f"DistributedDataParallel: parameter {self.names[i]!r} got its gradient twice "
                "in one backward pass. This happens with find_unused_parameters=True when the "
                "model runs forward twice before one backward and the second forward skips a "
                "parameter the first one used, or with reentrant activation checkpointing. "
                "Run one forward per backward, or checkpoint with use_reentrant=False")
        self.ready[i] = True
        bucket, k = self.where[i]
        self._copy_in(bucket, k)
        self.pending[bucket.index] -= 1
        if self.overlap and self.pending[bucket.index] == 0:
            self._launch_ready_buckets()

    def _copy_in(self, bucket: Bucket, k: int) -> None:
        """Put the gradient into its bucket slot. Without a comm hook, divide by the world
        size on the way (as torch does), which saves a pass over the bucket: the all-reduce
        then just sums."""
        if self._in_place(bucket):  # the gradient stays in .grad: see _reduce_in_place
            return
        p, view = bucket.params[k], bucket.views[k]
        divisor = self.comm.world_size if self.hook is None else 1
        if p.grad is None:  # an unused parameter contributes zeros
            view.zero_()
        elif p.grad.data_ptr() == view.data_ptr():  # autograd accumulated into the slot
            if divisor > 1:
                view.div_(divisor)
        else:
            if divisor > 1:
                torch.div(p.grad, divisor, out=view)
            else:
                view.copy_(p.grad)
            if self.as_view:  # from now on autograd accumulates straight into the bucket
                p.grad = view

    def _launch_ready_buckets(self) -> None:
        """Start every ready bucket, in index order only: bucket b+1 waits for bucket b, so
        all ranks issue the same collectives in the same order. The last bucket is left to
        the end-of-backward callback: it is ready when backward is over, so there is nothing
        left to overlap it with, and the caller's thread runs it without a hand-over."""
        last = len(self.buckets) - 1
        while self.next_bucket < last and self.pending[self.next_bucket] == 0:
            bucket = self.buckets[self.next_bucket]
            self.next_bucket += 1
            self.pending_at_launch.append(self.ready.count(False))
            self.futures.append(self.thread.submit(lambda b=bucket: self._reduce(b)))

    def _reduce(self, bucket: Bucket) -> float:
        """Run the comm hook on one bucket (on the comm thread for buckets started during
        backward)."""
        start = time.perf_counter()
        if self._in_place(bucket):
            out = self._reduce_in_place(bucket)
        elif self.hook is None:  # gradients were divided by the world size in _copy_in
            out = all_reduce(self.comm, bucket.buffer, op="sum", algorithm=self.algorithm)
        else:
            out = self.hook(self.comm, bucket)
        if out is not bucket.buffer:
            if not isinstance(out, torch.Tensor) or out.shape != bucket.buffer.shape:
                raise ValueError(
                    f"the comm hook must return a tensor shaped like bucket.buffer "
                    f"{tuple(bucket.buffer.shape)}, got "
                    f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
            bucket.buffer.copy_(out)
        end = time.perf_counter()
        self.comm.timeline.record(f"bucket {bucket.index}", "collective", start, end,
                                  bucket.nbytes)
        return end - start

    def _in_place(self, bucket: Bucket) -> bool:
        """Reduce this bucket's gradients where they lie? Not with a comm hook (it gets the
        flat buffer), nor with bucket views (already flat), nor for 16-bit gradients (their
        sum could overflow: those are divided first, as torch does)."""
        return (self.hook is None and not self.as_view
                and bucket.buffer.dtype in _COALESCE_DTYPES)

    def _reduce_in_place(self, bucket: Bucket) -> torch.Tensor:
        """Average the bucket's gradients where they lie, as one coalesced all-reduce.

        On a local-backend world communicator that goes through shared memory straight from
        ``param.grad`` and back, skipping the copy into the bucket and the copy out of it
        (two passes over every gradient, which cost as much as the reduction itself here);
        elsewhere ``all_reduce_coalesced`` packs them into ``bucket.buffer`` as torch does.
        A missing or unused gradient is reduced through a stand-in, written back at the end
        unless no rank used the parameter."""
        grads, unused = [], set(self.unused)
        bucket.temps = {}
        for k, (i, p) in enumerate(zip(bucket.members, bucket.params)):
            g = p.grad
            if g is None or i in unused or not g.is_contiguous():
                g = torch.zeros_like(p) if g is None else g.contiguous().clone()
                bucket.temps[k] = g
            grads.append(g)
        all_reduce_coalesced(self.comm, grads, op="avg", algorithm=self.algorithm,
                             buffer=bucket.buffer)
        return bucket.buffer

    # -- backward side: end of the pass -------------------------------------------------------
    def _finalize(self) -> None:
        """Runs when the autograd engine finishes the backward pass: wait for every bucket,
        then write the averaged gradients into ``param.grad``."""
        if not self.armed:  # the pass was already abandoned after an error
            return
        start = time.perf_counter()
        try:
            missing = [i for i, r in enumerate(self.ready) if not r]
            if missing:
                raise RuntimeError(self._missing_message(missing))
            comm_s = sum(f.result() for f in self.futures)  # the buckets started in backward
            rest = self.buckets[self.next_bucket:]  # all of them without overlap
            self.pending_at_launch += [0] * len(rest)
            comm_s += sum(self._reduce(b) for b in rest)  # on this thread, after backward
            self._copy_out(self._globally_unused() if self.find_unused else set())
        except BaseException:
            self._drain()
            raise
        finally:
            pending_at_launch = self.pending_at_launch
            self._end_pass()
        wait = time.perf_counter() - start
        self.stats.update(comm_s=comm_s, wait_s=wait, pending_at_launch=pending_at_launch)
        self.comm.timeline.record("wait for buckets", "wait", start, start + wait)

    def _drain(self) -> None:
        """After an error, let the buckets already started finish (the other ranks run the
        same collectives), so that nothing else uses the communicator concurrently."""
        for f in self.futures:
            try:
                f.result()
            except BaseException:
                pass

    def _end_pass(self) -> None:
        self._reset()
        self.used = [False] * len(self.params)
        self.expect_sync = False

    def _globally_unused(self) -> set[int]:
        """Parameters no rank used since the last sync keep their ``.grad`` (PyTorch's rule)."""
        flags = torch.tensor(self.used, dtype=torch.int32)
        all_reduce(self.comm, flags, op="max")
        return {i for i, used in enumerate(flags.tolist()) if not used}

    def _copy_out(self, skip: set[int]) -> None:
        for bucket in self.buckets:
            if self._in_place(bucket):
                self._write_temps(bucket, skip)
                continue
            for i, p, view in zip(bucket.members, bucket.params, bucket.views):
                if i in skip:
                    continue
                if p.grad is None:
                    p.grad = view if self.as_view else view.clone()
                elif p.grad.data_ptr() != view.data_ptr():
                    p.grad.copy_(view)

    @staticmethod
    def _write_temps(bucket: Bucket, skip: set[int]) -> None:
        for k, g in bucket.temps.items():
            p = bucket.params[k]
            if bucket.members[k] in skip:
                continue
            if p.grad is None:
                p.grad = g.view_as(p)
            else:
                p.grad.copy_(g.view_as(p))
        bucket.temps = {}

    def _missing_message(self, missing: list[int]) -> str:
        names = [self.names[i] for i in missing]
        shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        return (
            f"DistributedDataParallel: {len(names)} parameter(s) received no gradient in this "
            f"backward pass: {shown}. Their buckets can never be reduced, so the other ranks "
            "would wait forever. If some parameters take no part in the loss (in some steps "
            "or always), construct DistributedDataParallel(..., find_unused_parameters=True); "
            "if they are never used, set requires_grad=False on them or remove them.")


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors inside a forward pass's output (a tensor, or lists, tuples, dicts of them)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors_in(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensors_in(x)]
    return []


def reachable_params(outputs) -> set[int]:
    """ids of the leaf tensors the autograd graph of ``outputs`` reaches: walk from each
    output's ``grad_fn`` through ``next_functions``; an ``AccumulateGrad`` node is a leaf."""
    found = {id(t) for t in tensors_in(outputs) if t.requires_grad and t.grad_fn is None}
    stack = [t.grad_fn for t in tensors_in(outputs) if t.grad_fn is not None]
    seen = set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            found.add(id(fn.variable))
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return found
