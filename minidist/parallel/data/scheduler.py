"""The bucket scheduler behind ``DistributedDataParallel``: *when* each bucket is reduced.

This is the machinery of PyTorch DDP as Li et al. describe it ("PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", VLDB 2020, sections 3.2 and 4.2);
*what* reducing a bucket means is a pluggable ``BucketReduction`` (``reductions.py``).

* Buckets. One all-reduce per parameter pays the latency (alpha) hundreds of times; one
  all-reduce of everything cannot start before the whole backward pass is over. DDP packs
  gradients into buckets of about ``bucket_cap_mb`` and reduces bucket by bucket, in
  *reverse* registration order, because backward produces the last layers' gradients first
  (``buckets.py``).
* Hooks. An autograd hook on every parameter fires when its gradient has been accumulated
  and marks it ready (copying it into its bucket slot if the reduction wants the flat
  layout). When a bucket's last gradient is in, the bucket is started while backward goes
  on computing earlier layers. Buckets are started strictly in index order, so every rank
  issues the same sequence of collectives even if its hooks fire in a different order.
* Overlap. A collective here is a sequence of blocking sends and receives, so "start" means
  "hand it to a communication thread", just as a torch ProcessGroup runs its work on worker
  threads. At the end of backward (an autograd-engine callback) the scheduler waits for
  every bucket, reduces the last one itself (nothing is left to overlap it with), calls the
  reduction's ``finish`` and writes the results into ``param.grad``. Overlap hides
  communication only where it does not need the cores backward is using (on GPUs the copy
  engines and the network do it); with as many ranks as cores, it gains little.
* Unused parameters. A parameter that got no gradient would keep its bucket from ever being
  ready. With ``find_unused_parameters=True`` the forward pass walks the autograd graph, and
  the parameters it does not reach count as ready (their slot holds their current gradient,
  or zeros); afterwards one small all-reduce says which were unused on *every* rank, and those
  keep their ``.grad`` untouched, as in PyTorch. Without it, a missing gradient is an error
  that names the parameters and the fix.
* ``no_sync``. Whether a backward synchronizes is decided by the latest ``prepare(outputs,
  sync)``, i.e. by the last forward. ``SyncSwitch.no_sync()`` exists once, here; DDP's
  ``no_sync`` and the naive version use it. A pipeline stage that should synchronize only on
  its last micro-batch runs every forward under ``no_sync()`` and re-arms right before the
  last backward, as ``torch.distributed.pipelining`` does with ``prepare_for_backward``::

      with ddp.no_sync():
          outs = [ddp(x) for x in micro_batches]       # 1F1B interleaves these, too
      ...backward of all but the last micro-batch...
      ddp.scheduler.prepare(outs[-1], sync=True)        # this backward reduces the sum
      outs[-1].backward(grad)

A strategy plugs in a reduction, not a branch here::

      scheduler = BucketScheduler(comm, named_params, cap_bytes, reduction=ShardedGradients())
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from contextlib import contextmanager

import torch
from torch import nn

from ...collectives import all_reduce
from ...transports.clock import WALL
from .buckets import Bucket, assign_buckets
from .graph import at_backward_end, reachable_params
from .reductions import BucketReduction


class CommThread:
    """A single background thread that runs submitted functions in order (FIFO), so that
    collectives are issued in the same order on every rank while the caller computes.

    Hand-offs carry time (``clock``: the communicator's, ``comm.clock``): ``submit`` stamps
    the job with the submitter's ``now()``, the thread starts it no earlier than that, and
    the future keeps the thread's time when it finished (``finished_at``); ``result(fut)``
    waits and moves the waiting thread's clock to it. Under virtual time this is what makes
    a bucket's all-reduce start when backward produced it and the end of backward wait for
    it exactly as long as a cluster would; on the wall clock the stamps cost nothing."""

    def __init__(self, name: str = "minidist-ddp-comm", clock=WALL):
        self.name, self.clock = name, clock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn) -> Future:
        if self._thread is None or not self._thread.is_alive():
            # a daemon: a rank that fails mid-step must still be able to exit
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        fut: Future = Future()
        self._queue.put((fn, fut, self.clock.now()))
        return fut

    def result(self, fut: Future):
        """``fut.result()`` (raising what the job raised), the waiting thread's clock moved
        to when the job finished."""
        try:
            return fut.result()
        finally:
            self.clock.at_least(fut.finished_at)

    def _run(self) -> None:
        while True:
            fn, fut, stamp = self._queue.get()
            self.clock.at_least(stamp)  # the job exists from the submitter's time on
            try:
                out = fn()
            except BaseException as e:  # handed to whoever waits on the future
                fut.finished_at = self.clock.now()
                fut.set_exception(e)
            else:
                fut.finished_at = self.clock.now()
                fut.set_result(out)


class SyncSwitch:
    """``no_sync()``, the one implementation every data-parallel wrapper shares."""

    def __init__(self):
        self.require_backward_grad_sync = True

    def will_sync(self) -> bool:
        """Will a backward of a forward run now reduce the gradients?"""
        return torch.is_grad_enabled() and self.require_backward_grad_sync

    @contextmanager
    def no_sync(self):
        """Skip the reduction for backward passes of forwards run inside the block: gradients
        accumulate locally in ``.grad``, and the first synchronizing backward after it
        reduces the accumulated sum (gradient accumulation at the cost of one all-reduce)."""
        before, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before


class BucketScheduler(SyncSwitch):
    """Buckets a module's gradients and has ``reduction`` reduce them during backward.

    The wrapper drives it: ``prepare(outputs, sync)`` after each forward pass, then the
    autograd hooks and the end-of-backward callback do the rest. ``stats`` describes the
    last synchronizing backward."""

    def __init__(self, comm, named_params: list[tuple[str, nn.Parameter]], cap_bytes: float,
                 reduction: BucketReduction, overlap: bool = True, find_unused: bool = False,
                 as_view: bool = False):
        super().__init__()
        self.comm, self.overlap, self.find_unused, self.as_view = \
            comm, overlap, find_unused, as_view
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.buckets = [Bucket(b, [self.params[i] for i in idx], [self.names[i] for i in idx],
                               idx) for b, idx in enumerate(assign_buckets(self.params, cap_bytes))]
        self.where = {i: (b, k) for b in self.buckets for k, i in enumerate(b.members)}
        self.thread = CommThread(clock=getattr(comm, "clock", WALL))
        self.used = [False] * len(self.params)  # got a gradient since the last sync
        self.expect_sync = False
        self.unused: list[int] = []
        self.stats: dict = {"comm_s": 0.0, "wait_s": 0.0, "buckets": len(self.buckets),
                            "pending_at_launch": []}
        self._reset()
        self.reduction = reduction
        self._handles = [p.register_post_accumulate_grad_hook(
            lambda _p, i=i: self._on_grad(i)) for i, p in enumerate(self.params)]

    @property
    def reduction(self) -> BucketReduction:
        """What reducing one bucket means; may be replaced between steps."""
        return self._reduction

    @reduction.setter
    def reduction(self, reduction: BucketReduction) -> None:
        if not isinstance(reduction, BucketReduction):
            raise TypeError("reduction must be a BucketReduction (minidist.parallel.data."
                            f"reductions), got {type(reduction).__name__}")
        if self.armed:
            raise RuntimeError("cannot change the bucket reduction during a backward pass")
        self._reduction = reduction
        for b in self.buckets:  # gradient views live in the buffer: always flat
            b.flat = self.as_view or reduction.needs_flat(b)

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
        at_backward_end(self._finalize)
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
        if bucket.flat:
            bucket.copy_in(k, self._reduction.divisor(self.comm, bucket), self.as_view)
        self.pending[bucket.index] -= 1
        if self.overlap and self.pending[bucket.index] == 0:
            self._launch_ready_buckets()

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
            self.futures.append(self.thread.submit(lambda b=bucket: self._run(b)))

    def _run(self, bucket: Bucket) -> float:
        """Reduce one bucket (on the comm thread for buckets started during backward);
        returns the seconds it took."""
        start = self.comm.now()
        bucket.gather(set(self.unused))
        self._reduction.reduce(self.comm, bucket)
        end = self.comm.now()
        self.comm.timeline.record(f"bucket {bucket.index}", "collective", start, end,
                                  bucket.nbytes)
        return end - start

    # -- backward side: end of the pass -------------------------------------------------------
    def _finalize(self) -> None:
        """Runs when the autograd engine finishes the backward pass: wait for every bucket,
        let the reduction finish, then write the results into ``param.grad``."""
        if not self.armed:  # the pass was already abandoned after an error
            return
        start = self.comm.now()
        try:
            missing = [i for i, r in enumerate(self.ready) if not r]
            if missing:
                raise RuntimeError(self._missing_message(missing))
            # the buckets started in backward
            comm_s = sum(self.thread.result(f) for f in self.futures)
            rest = self.buckets[self.next_bucket:]  # all of them without overlap
            self.pending_at_launch += [0] * len(rest)
            comm_s += sum(self._run(b) for b in rest)  # on this thread, after backward
            skip = self._globally_unused() if self.find_unused else set()
            self._reduction.finish(self.comm, self.buckets)
            self._write_back(skip)
        except BaseException:
            self._drain()
            raise
        finally:
            pending_at_launch = self.pending_at_launch
            self._end_pass()
        wait = self.comm.now() - start
        self.stats.update(comm_s=comm_s, wait_s=wait, pending_at_launch=pending_at_launch)
        self.comm.timeline.record("wait for buckets", "wait", start, start + wait)

    def _write_back(self, skip: set[int]) -> None:
        for bucket in self.buckets:
            if self._reduction.write_back:
                bucket.write_back(skip, self.as_view)
            bucket.temps = {}

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
        # on the communicator's device: NCCL reduces CUDA tensors only
        flags = torch.tensor(self.used, dtype=torch.int32, device=self.comm.device)
        all_reduce(self.comm, flags, op="max")
        return {i for i, used in enumerate(flags.tolist()) if not used}

    def _missing_message(self, missing: list[int]) -> str:
        names = [self.names[i] for i in missing]
        shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        return (
            f"DistributedDataParallel: {len(names)} parameter(s) received no gradient in this "
            f"backward pass: {shown}. Their buckets can never be reduced, so the other ranks "
            "would wait forever. If some parameters take no part in the loss (in some steps "
            "or always), construct DistributedDataParallel(..., find_unused_parameters=True); "
            "if they are never used, set requires_grad=False on them or remove them.")
