"""One server's loop: receive a header from any worker, act on it, answer the pulls the mode
now allows, until every worker has closed or left.

The loop is ps-lite's server in miniature (Li et al., OSDI 2014): the server owns a shard
(``sharding.py``) and an optimizer over it; a push is a gradient of that shard, a pull asks
for the shard's current values (on one machine in sync mode the gradient is already in the
worker's slot when its header arrives, and a reply carries no shard: the worker copies it
from shared memory, ``shared_shards.py``). The mode decides when a push is applied and
when a pull is answered (``rules.py``): sync queues pushes until every active worker has
pushed for the step, then applies their average; async and ssp apply each push at once;
ssp holds back the pulls of a worker too far ahead. Pulls that may not be answered yet
wait in ``deferred``.

Membership: a ``CLOSE`` header means a worker is done. A worker that returns without one is
noticed while the server is idle: its posted receive on the ``BYE`` tag fails with
``md.PeerLeftError``. So is a worker killed under ``md.launch(...,
on_rank_failure="continue")``: the launcher marks it dead in the segment, and whatever it
sent before dying is drained first (a push cut off between its header and its gradient
is dropped). Either way the server logs it, records it in the report with the pushes it
had received from it, and goes on with the others (in ssp the bound stops counting it); in
sync mode, a departure that leaves a step short raises ``WorkerLeftError`` unless
``on_worker_exit="continue"``.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import torch

from ...comm import ANY_SOURCE
from ...errors import CommTimeout, PeerLeftError, WorkerLeftError
from . import messages as P
from .reports import ServerReport
from .rules import RunningMean, may_pull, sync_round

log = logging.getLogger("minidist")
IDLE_SLICE = 0.05  # seconds the server waits for a header before checking who has left
PROBE_WAIT = 0.002  # seconds spent on each worker's BYE receive when checking it


class ShardServer:
    """Serves shard ``comm.rank`` of ``plan`` to ``workers`` (``ParameterServer`` makes it)."""

    def __init__(self, comm, params, plan, workers, mode, staleness, optimizer_class,
                 optimizer_kwargs, on_worker_exit, shared=None):
        self.comm, self.params, self.plan, self.me = comm, params, plan, comm.rank
        self.mode, self.staleness, self.on_exit = mode, staleness, on_worker_exit
        self.workers = list(workers)
        self.shared = shared  # a SharedShard: pushes and pulls skip the wire
        # the shard, one flat buffer; the optimizer's parameters are views into it, so a
        # pull sends it as it lies, without packing
        self.flat = plan.pack(self.me, [p.detach() for p in params]).clone()
        if shared is not None:
            self.flat = shared.params.copy_(self.flat)
        self.leaves = [t.requires_grad_(True) for t in plan.split(self.me, self.flat)]
        self.optimizer = optimizer_class(self.leaves, **optimizer_kwargs) if self.leaves \
            else None
        self.segments = plan.segments(self.me)
        self.version = 0
        self.active = set(self.workers)
        self.clocks = {w: 0 for w in self.workers}
        self.queued: dict[int, deque] = {w: deque() for w in self.workers}
        self.last_staleness = {w: -1 for w in self.workers}
        self.deferred: list[int] = []
        self.sends: dict[int, list] = {w: [] for w in self.workers}  # pull replies in flight
        self.pool: list[torch.Tensor] = []  # receive buffers to reuse (no page faults)
        self.stats = ServerReport(self.me, mode, plan.numel(self.me))
        self.mean = RunningMean()  # sync: the step's average, added up as pushes arrive

    def report(self) -> ServerReport:
        return self.stats

    # -- the loop ---------------------------------------------------------------------------
    def serve(self) -> ServerReport:
        byes = {w: self.comm.control.irecv(P.EMPTY, w, P.BYE) for w in self.workers}
        hdr, buf, last_news = None, P.header_buffer(), time.perf_counter()
        while self.active or any(self.queued.values()):
            if hdr is None:  # posted only while a header is expected: none is left behind
                hdr = self.comm.control.irecv(buf, ANY_SOURCE, P.HEADER)
            got = self._wait(hdr, IDLE_SLICE)
            if got is not None:
                hdr = None
                self._handle(got, buf)
            elif not self._notice_deaths(byes, hdr):
                self._check_stalled(last_news)
                continue
            last_news = time.perf_counter()
            self._progress()
        self._finish(byes)
        return self.stats

    @staticmethod
    def _wait(req, timeout: float) -> int | None:
        """The source of ``req`` once it completes, or None after ``timeout`` seconds."""
        try:
            return req.wait(timeout=timeout, op="parameter-server recv")
        except PeerLeftError:  # a CommTimeout too, but not one to ignore
            raise
        except CommTimeout:
            return None

    def _handle(self, src: int, buf: torch.Tensor) -> None:
        kind, a, b = (int(v) for v in buf)
        if src not in self.active:
            raise RuntimeError(f"rank {self.me} (parameter server): rank {src} sent a "
                               f"{P.KINDS.get(kind, kind)} but is not an active worker")
        if kind == P.PUSH:
            self._receive_push(src, version=a, numel=b)
        elif kind == P.PULL:
            self.deferred.append(src)
        elif kind == P.CLOSE:
            self._leave(src, "closed")
        else:
            raise RuntimeError(f"rank {self.me}: unknown message kind {kind} from rank {src}")

    def _receive_push(self, src: int, version: int, numel: int) -> None:
        mine = self.plan.numel(self.me)
        if numel != mine:
            raise ValueError(f"rank {self.me} (parameter server): worker rank {src} pushed a "
                             f"gradient of {numel} elements, but this server's shard holds "
                             f"{mine}: the worker's model differs from the servers'")
        start = self.comm.now()
        grad = self._gradient_from(src)
        if grad is None:
            return
        self.comm.timeline.record("ps.push", "recv", start, self.comm.now(),
                                  grad.numel() * grad.element_size(), src)
        self.stats.pushes += 1
        self.stats.bytes_in += grad.numel() * grad.element_size()
        self.stats.pushes_by_worker[src] = self.stats.pushes_by_worker.get(src, 0) + 1
        self.clocks[src] += 1
        if self.mode == "sync":
            self.queued[src].append((grad, version))
            self._check_sync_departures()
            self.mean.catch_up(self._heads(), self.active)
        else:
            self._apply(grad, [(src, version)])
            self.pool.append(grad)

    def _gradient_from(self, src: int) -> torch.Tensor | None:
        """Worker ``src``'s pushed gradient: its shared slot, or received into a buffer
        (None if it died before it was all sent)."""
        if self.shared is not None:  # already written there; count it as the message
            slot = self.shared.slots[src]
            self.comm.stats.on_recv(src, slot.numel() * slot.element_size())
            return slot
        grad = self.pool.pop() if self.pool else torch.empty_like(self.flat)
        reqs = [self.comm.strategy.irecv(grad[g.start:g.stop], src, P.GRADS)
                for g in self.segments]
        try:
            for r in reqs:
                r.wait(op="parameter-server push recv")
        except PeerLeftError:  # it died between the header and the gradient
            self._leave(src, "died")
            return None
        return grad

    # -- updates and replies ----------------------------------------------------------------
    def _progress(self) -> None:
        while self.mode == "sync":
            members = sync_round(self.queued, self.active)
            if members is None:
                break
            mean = self.mean.finish(self._heads(), members)
            taken = [self.queued[w].popleft() for w in members]
            self._apply(mean, [(w, v) for w, (_, v) in zip(members, taken)])
            if self.shared is None:  # (the slots are the workers')
                self.pool += [g for g, _ in taken]
        self._answer_pulls()

    def _heads(self) -> dict[int, torch.Tensor]:
        return {w: q[0][0] for w, q in self.queued.items() if q}

    def _apply(self, grad: torch.Tensor, origins: list[tuple[int, int]]) -> None:
        """One optimizer step with ``grad`` (this shard's flat gradient); ``origins``: the
        (worker, version pulled) of each push it came from, for the staleness record."""
        start = self.comm.now()
        self._wait_sends()  # the buffer is about to change: pulls in flight must be out
        if self.optimizer is not None:
            for leaf, g in zip(self.leaves, self.plan.split(self.me, grad)):
                leaf.grad = g
            self.optimizer.step()
            for leaf in self.leaves:  # the buffer goes back to the pool
                leaf.grad = None
        for w, v in origins:
            self.last_staleness[w] = self.version - v
            self.stats.staleness.append(self.version - v)
        self.version += 1
        self.stats.updates += 1
        self.comm.timeline.record("ps.update", "compute", start, self.comm.now())

    def _answer_pulls(self) -> None:
        ready = [w for w in self.deferred if may_pull(self.mode, w, self.clocks, self.active,
                                                      self.queued, self.staleness)]
        # server s starts answering at its own offset among the workers, so that S servers
        # answering the same pulls do not all send to the same worker first (incast)
        start = self.me * len(self.workers) // self.plan.num_servers
        ready.sort(key=lambda w: (self.workers.index(w) - start) % len(self.workers))
        for w in ready:
            self.deferred.remove(w)
            self._send_params(w)

    def _send_params(self, w: int) -> None:
        if self.mode == "ssp" and self.active:
            ahead = self.clocks[w] - min(self.clocks[a] for a in self.active)
            self.stats.max_ahead = max(self.stats.max_ahead, ahead)
        start = self.comm.now()
        reply = P.reply(self.version, self.last_staleness[w])
        self.sends[w] = [r for r in self.sends[w] if not r.test()]
        self.sends[w].append(self.comm.control.isend(reply, w, P.REPLY))
        nbytes = self.flat.numel() * self.flat.element_size()
        if self.shared is None:
            self.sends[w] += [self.comm.strategy.isend(self.flat[g.start:g.stop], w,
                                                         P.PARAMS) for g in self.segments]
        else:  # the worker copies the shard itself; count it as the message it replaces
            self.comm.stats.on_send(w, nbytes)
            log.debug("rank %d -> %d: parameters (%d bytes) ready in shared memory",
                      self.me, w, nbytes)
        self.comm.timeline.record("ps.pull", "send", start, self.comm.now(), nbytes, w)
        self.stats.pulls += 1
        self.stats.bytes_out += nbytes

    # -- membership -------------------------------------------------------------------------
    def _leave(self, w: int, reason: str) -> None:
        self.active.discard(w)
        self.stats.departed[w] = reason
        self.stats.departed_step[w] = self.clocks[w]
        if w in self.deferred:
            self.deferred.remove(w)
        if reason == "died":  # what was on its way to it will never be received
            self.sends[w] = []
        log_at = logging.INFO if reason == "closed" else logging.WARNING
        log.log(log_at, "rank %d (parameter server, %s): worker rank %d %s after %d pushes; "
                "%d workers remain", self.me, self.mode, w, reason, self.clocks[w],
                len(self.active))
        self._check_sync_departures()

    def _check_sync_departures(self) -> None:
        """sync, on_worker_exit="error": a worker that left after c pushes while another has
        pushed more can never complete that step."""
        if self.mode != "sync" or self.on_exit != "error" or not self.active:
            return
        furthest = max(self.clocks[w] for w in self.active)
        for w, reason in sorted(self.stats.departed.items()):
            if self.clocks[w] < furthest:
                raise WorkerLeftError(self.me, w, reason, self.clocks[w])

    def _notice_deaths(self, byes: dict, hdr) -> bool:
        """Idle: has an active worker returned without closing? Checking drains what it
        sent before leaving; if that completed the header receive, handle it first (the
        worker may have pushed) and check again when idle next time."""
        dead = [w for w in sorted(self.active) if not byes[w].test() and _left(byes[w])]
        if not dead or hdr.test():
            return False
        for w in dead:
            self._leave(w, "died")
        return True

    def _check_stalled(self, since: float) -> None:
        idle = time.perf_counter() - since
        if idle > self.comm.timeout:
            waiting = sorted(w for w in self.active if not self.queued[w])
            raise CommTimeout("parameter-server recv", None, P.HEADER, self.comm.timeout,
                              self.me, f"(mode {self.mode!r}, version {self.version}: no "
                              f"worker sent anything; waiting for workers {waiting})")

    def _wait_sends(self) -> None:
        for reqs in self.sends.values():
            for r in reqs:
                r.wait(op="parameter-server send")
            reqs.clear()

    def _finish(self, byes: dict) -> None:
        self._wait_sends()
        for w, reason in self.stats.departed.items():
            if reason == "closed":
                byes[w].wait(op="parameter-server recv")
        self.plan.unpack(self.me, self.flat, self.params)
        if self.shared is not None:  # done: let the shared memory go
            self.flat, self.leaves, self.optimizer = self.flat.clone(), [], None
            self.shared.close()
            self.shared = None


def _left(req) -> bool:
    """Whether the sender of ``req`` (a receive from a named rank) has left without sending."""
    try:
        req.wait(timeout=PROBE_WAIT, op="parameter-server liveness check")
    except PeerLeftError:
        return True
    except CommTimeout:
        return False
    return False
