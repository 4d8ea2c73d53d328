"""A worker's side: ``pull`` the parameters from every server, ``push`` each server its shard
of the gradient, ``close`` when done (``messages.py`` has the messages).

A pull asks all servers at once and waits for all of them: the servers decide when to
answer (sync: once this worker's last push is applied; ssp: once it is no more than s steps
ahead of the slowest; async: at once), so the wait time measured here is what the
consistency model costs this worker. A push sends each server its segments of the gradient
(``sharding.py``: big pieces straight from ``p.grad``, small ones packed together) and
returns once they are out; it does not wait for the update. In sync mode it also asks for
the next parameters at once (ps-lite's worker pulls right after it pushes): the reply is
the same whenever it is asked for, since the step cannot complete without this worker,
and a server that knows every worker's pull when the step completes can answer them in
an order that spreads the load (``server.py``). The parameters land in the model during
the next ``pull()`` (or ``close()``, so that a closed worker holds the final parameters;
or the next ``push()``, if no pull came between: a pull always reflects every push).

On one machine, in sync mode, the shards and the gradients skip the wire: a push writes
the worker's slot in the server's shared memory, a pull copies the shard from there
(``shared_shards.py``).

Stragglers: ``md.slow_rank(comm, rank, seconds)`` and ``md.inject_delay`` make a worker sleep
at ``"forward"`` (the end of ``pull``, just before the caller's forward pass) and at
``"step"`` (the start of ``push``), as every strategy does (``minidist/faults.py``).
"""

from __future__ import annotations

import logging

import torch

from ...faults import maybe_delay
from . import messages as P
from .reports import WorkerReport

log = logging.getLogger("minidist")


class WorkerClient:
    """Talks to servers ``0..plan.num_servers-1`` for ``params`` (``ParameterServer``)."""

    def __init__(self, comm, named_params: list[tuple[str, torch.Tensor]], plan, mode: str,
                 shared: dict | None = None):
        self.comm, self.plan = comm, plan
        self.shared = shared  # {server: SharedShard}: pushes and pulls skip the wire
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.versions = [0] * plan.num_servers  # what each server had applied at our pull
        self.segments = [plan.segments(s) for s in range(plan.num_servers)]
        self.closed = False
        self.mode = mode
        self.prefetched: tuple | None = None  # sync: the pull that push() already asked for
        self.stats = WorkerReport(comm.rank, mode)

    def report(self) -> WorkerReport:
        return self.stats

    def pull(self) -> int:
        self._check_open("pull")
        start = self.comm.now()
        pending = self.prefetched if self.prefetched is not None else self._request()
        self.prefetched = None
        replies = self._receive(pending)
        self._note_pull(start, replies)
        maybe_delay(self.comm, "forward")
        return self.versions[0]

    def _request(self) -> tuple[list, list, list]:
        """Ask every server for its shard and post the receives: the reply headers, and
        each segment straight into the parameter where it can (else a staging buffer)."""
        servers = range(self.plan.num_servers)
        for s in servers:
            self.comm.control.send(P.header(P.PULL, self.stats.steps), s, P.HEADER)
        replies = [P.reply_buffer() for _ in servers]
        reqs = [self.comm.control.irecv(replies[s], s, P.REPLY) for s in servers]
        staged = []  # (segment, buffer) of segments not received in place
        targets = [p.data for p in self.params]
        for s in servers if self.shared is None else ():
            for g in self.segments[s]:
                buf = g.view(targets)
                if buf is None:
                    buf = targets[0].new_empty(g.stop - g.start)
                    staged.append((g, buf))
                reqs.append(self.comm.strategy.irecv(buf, s, P.PARAMS))
        return replies, reqs, staged

    def _receive(self, pending: tuple[list, list, list]) -> list[torch.Tensor]:
        replies, reqs, staged = pending
        for r in reqs:
            r.wait(op="parameter-server pull")
        targets = [p.data for p in self.params]
        for g, buf in staged:
            g.unpack(buf, targets)
        for s, shard in (self.shared or {}).items():  # each server's shard, as it lies
            self.plan.unpack(s, shard.params, targets)
            self.comm.stats.on_recv(s, shard.params.numel() * shard.params.element_size())
        return replies

    def _note_pull(self, start: float, replies: list[torch.Tensor]) -> None:
        self.versions = [int(r[0]) for r in replies]
        worst = max(int(r[1]) for r in replies)
        if worst >= 0:
            self.stats.staleness.append(worst)
        end = self.comm.now()
        nbytes = sum(self.plan.numel(s) for s in range(self.plan.num_servers)) \
            * self.params[0].element_size()
        self.comm.timeline.record("ps.pull", "recv", start, end, nbytes, None)
        self.stats.pulls += 1
        self.stats.pull_wait_s += end - start
        self.stats.versions.append(self.versions[0])

    def push(self, grads: list[torch.Tensor] | None = None) -> None:
        """Sends every segment (in place where it can: no copy) and waits until they are
        out, so that the caller may change its gradients as soon as this returns."""
        self._check_open("push")
        maybe_delay(self.comm, "step")
        grads = self._gradients(grads)
        start = self.comm.now()
        if self.prefetched is not None:  # pushed twice without a pull: take that pull now,
            self.versions = [int(r[0]) for r in self._receive(self.prefetched)]
            self.prefetched = None  # so the servers are done with our slots (shared_shards)
        reqs, nbytes = [], 0
        for s in self._server_order():
            reqs += self._send_push(s, grads)
            nbytes += self.plan.numel(s) * self.params[0].element_size()
        for r in reqs:
            r.wait(op="parameter-server push")
        end = self.comm.now()
        self.comm.timeline.record("ps.push", "send", start, end, nbytes, None)
        self.stats.steps += 1
        self.stats.push_s += end - start
        if self.mode == "sync":
            self.prefetched = self._request()

    def _send_push(self, s: int, grads: list[torch.Tensor]) -> list:
        """The push header and server ``s``'s pieces of ``grads``: as messages after it,
        sent in place where they can be; or into our shared slot before it."""
        head = P.header(P.PUSH, self.versions[s], self.plan.numel(s))
        if self.shared is None:
            return [self.comm.control.isend(head, s, P.HEADER)] + [
                self.comm.strategy.isend(g.pack(grads), s, P.GRADS) for g in self.segments[s]]
        slot = self.shared[s].slots[self.comm.rank]
        self.plan.pack_into(s, grads, slot)
        self.comm.stats.on_send(s, slot.numel() * slot.element_size())
        log.debug("rank %d -> %d: gradient (%d bytes) into its slot in server %d's shared "
                  "memory", self.comm.rank, s, slot.numel() * slot.element_size(), s)
        return [self.comm.control.isend(head, s, P.HEADER)]

    def _server_order(self) -> list[int]:
        """Servers starting from this worker's own offset, so that W workers pushing at once
        do not all queue at server 0 first (incast) while the others idle."""
        n = self.plan.num_servers
        return [(self.comm.rank + k) % n for k in range(n)]

    def close(self) -> None:
        self._check_open("close")
        if self.prefetched is not None:  # the final parameters, into the model
            self._receive(self.prefetched)
            self.prefetched = None
        for s in range(self.plan.num_servers):
            self.comm.control.send(P.header(P.CLOSE, self.stats.steps), s, P.HEADER)
            self.comm.control.send(P.EMPTY, s, P.BYE)
        self.closed = True
        for shard in (self.shared or {}).values():
            shard.close()
        self.shared = None

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise RuntimeError(f"rank {self.comm.rank}: {what}() after close(); a closed "
                               "worker has left the parameter server")

    def _gradients(self, grads: list[torch.Tensor] | None) -> list[torch.Tensor]:
        """``grads`` checked against the parameters, or every ``p.grad`` (zeros where None)."""
        if grads is None:
            return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        grads = list(grads)
        if len(grads) != len(self.params):
            raise ValueError(f"push got {len(grads)} gradients, but the model has "
                             f"{len(self.params)} parameters (one gradient each, in "
                             "model.parameters() order)")
        for name, p, g in zip(self.names, self.params, grads):
            if not isinstance(g, torch.Tensor):
                raise TypeError(f"the gradient for {name!r} must be a tensor, got "
                                f"{type(g).__name__}")
            if g.shape != p.shape or g.dtype != p.dtype:
                raise ValueError(f"the gradient pushed for parameter {name!r} has shape "
                                 f"{tuple(g.shape)} and dtype {g.dtype}, but the parameter "
                                 f"has shape {tuple(p.shape)} and dtype {p.dtype}")
        return [g.detach() for g in grads]
