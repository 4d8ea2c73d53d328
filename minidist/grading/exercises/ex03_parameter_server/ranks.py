"""What runs on each rank in exercise 03's tests: the learner's server on rank 0, watched by
the :class:`Probe`, which sees every message it sends and receives as it happens; the
grader's workers on ranks 1..W.

Rank 0 runs the learner's server code; ranks 1..W are the grader's workers. Worker ``w``
pushes the gradient ``gradient(w, k)`` at its step ``k`` (fixed random numbers, known to the
grader, whatever the parameters), then waits for the server's reply. Worker 1 is a straggler:
it sleeps before each push, so pushes do not arrive in rank order.

The probe replaces the server communicator's ``isend`` and ``irecv`` (``comm.send`` and
``comm.recv`` go through them) and keeps its own count of each worker's pushes (its clock)
and replies. A break of the protocol raises :class:`ProtocolError` inside the learner's call,
so the feedback names the line: a receive by name instead of ``md.ANY_SOURCE``, a second reply
to one push, a reply before the step is complete, a reply that lets a worker run more than
``s`` steps ahead, a reply that carries the wrong parameters, and a wait for a push that can
never come (every worker waits for a reply) or while a worker the rule admits is still held.
"""

from __future__ import annotations

import time

import torch

from ....comm.communicator import ANY_SOURCE
from ...engine.compare import Tolerance, close
from .mistakes import ssp_mistakes, sync_hint, times

DIM, LR, DELAY = 8, 0.5, 0.03  # parameters; learning rate; the straggler's sleep (s)
TOLERANCE = Tolerance(1e-12, 1e-12)  # float64 sums of multiples of 1/64: to rounding


class ProtocolError(RuntimeError):
    """The learner's server broke the parameter server's protocol."""


def gradient(worker: int, step: int) -> torch.Tensor:
    """Worker ``worker``'s push at step ``step``: fixed, multiples of 1/64, float64."""
    g = torch.Generator().manual_seed(1000 * worker + step)
    return torch.round(torch.randn(DIM, generator=g, dtype=torch.float64) * 64) / 64


def initial() -> torch.Tensor:
    return torch.linspace(-1, 1, DIM, dtype=torch.float64)


def admits(clock: int, clocks, staleness: int) -> bool:
    """The SSP rule (Ho et al., NIPS 2013): a worker at clock c may go if c - min <= s."""
    return clock - min(clocks) <= staleness


# -- what runs on each rank: the learner's server on rank 0 (watched), the grader's workers ----
def worker_loop(comm, steps: int) -> list[torch.Tensor]:
    """A grader's worker: push, wait for the parameters, ``steps`` times."""
    params, got = initial(), []
    for k in range(steps):
        if comm.rank == 1 and comm.world_size > 2:
            time.sleep(DELAY)  # the straggler
        comm.send(gradient(comm.rank, k), 0)
        comm.recv(params, 0)
        got.append(params.clone())
    return got


def sync_case(comm, namespace, steps: int):
    """Rank 0: ``sync_step`` ``steps`` times; the others: the grader's workers."""
    if comm.rank > 0:
        return worker_loop(comm, steps)
    params, probe = initial(), Probe(comm, steps, LR)
    try:
        for _ in range(steps):
            namespace["sync_step"](comm, params, LR)
            probe.after_sync_step(params)
    finally:
        probe.close()
    return params


def ssp_case(comm, namespace, staleness: int, steps: int):
    """Rank 0: ``ssp_serve`` with the reference rule; the others: the grader's workers."""
    if comm.rank > 0:
        return worker_loop(comm, steps)
    probe = Probe(comm, steps, LR, staleness)
    try:
        namespace["ssp_serve"](comm, initial(), LR, staleness, steps, admits)
        probe.after_serve()
    finally:
        probe.close()
    return {"lead": probe.lead}


class Watched:
    """A request of the learner's server, checked by the probe when it completes or blocks."""

    def __init__(self, probe: Probe, request, receive: bool):
        self.probe, self.request, self.receive, self.counted = probe, request, receive, False

    def __getattr__(self, name):
        return getattr(self.request, name)

    def test(self) -> bool:
        done = self.request.test()
        if done:
            self.probe.completed(self)
        elif self.receive:
            self.probe.before_waiting()
        return done

    def wait(self, timeout: float | None = None, op: str | None = None):
        if self.receive and not self.request.test():
            self.probe.before_waiting()
        source = self.request.wait(timeout, op)
        self.probe.completed(self)
        return source


class Probe:
    """Watches the server's messages (see the module docstring). ``staleness`` None: sync
    mode, whose step ``step`` the harness sets before each call."""

    def __init__(self, comm, steps: int, lr: float, staleness: int | None = None):
        self.workers = list(range(1, comm.world_size))
        self.pushes = {w: 0 for w in self.workers}  # each worker's clock
        self.replies = {w: 0 for w in self.workers}
        self.steps, self.lr, self.staleness, self.step = steps, lr, staleness, 0
        self.expected = initial()  # the parameters once every push so far is applied
        self.step_start = initial()  # sync: the parameters at the start of the step
        self.lead = 0  # the largest lead of a worker let go, over the slowest
        self.comm, self._isend, self._irecv = comm, comm.isend, comm.irecv
        comm.isend, comm.irecv = self.isend, self.irecv

    def close(self) -> None:
        """Give the communicator its own isend and irecv back (the next case has its own)."""
        self.comm.isend, self.comm.irecv = self._isend, self._irecv

    @property
    def name(self) -> str:
        return "sync_step" if self.staleness is None else "ssp_serve"

    # -- receives ---------------------------------------------------------------------------
    def irecv(self, tensor, src: int = ANY_SOURCE, tag: int = 0):
        if src != ANY_SOURCE:
            late = " (here worker 1 is a straggler: the others would wait behind it)" \
                if len(self.workers) > 1 else ""
            raise ProtocolError(
                f"the server received from rank {src} by name (src={src}): it cannot know "
                f"which worker pushes next{late}. Receive with src=md.ANY_SOURCE; comm.recv "
                "returns the rank that sent the message")
        return Watched(self, self._irecv(tensor, src, tag), receive=True)

    def completed(self, req: Watched) -> None:
        if req.counted or not req.receive:
            return
        req.counted, w = True, req.request.source
        if w in self.pushes:
            if self.staleness is not None:
                self.expected = self.expected - self.lr * gradient(w, self.pushes[w])
            self.pushes[w] += 1

    def before_waiting(self) -> None:
        """The server is about to block for a push: is one possible, is none overdue?"""
        held = [w for w in self.workers if self.pushes[w] > self.replies[w]]
        if self.staleness is not None:
            for w in held:
                if self._lead(w) <= self.staleness:
                    raise ProtocolError(
                        f"{self.name} waits for the next push while worker {w} waits for "
                        f"your reply, although the rule lets it go: its clock is "
                        f"{self.pushes[w]}, the slowest clock {self._slowest()}, and "
                        f"{self.pushes[w]} - {self._slowest()} = {self._lead(w)} <= s = "
                        f"{self.staleness}. After every push, reply to each worker you hold "
                        "back that the rule now admits, not only to the one that pushed; "
                        "else it waits forever (to remove workers from the list you walk, "
                        "walk a copy, list(held): removing from the list itself skips the "
                        "next one)")
        if any(self.pushes[w] == self.replies[w] < self.steps for w in self.workers):
            return  # a worker is computing: its push will come
        waiting = ", ".join(str(w) for w in held)
        if self.staleness is None:
            raise ProtocolError(
                f"sync_step waits for a gradient that no worker will send: in step "
                f"{self.step + 1} every worker (ranks {waiting}) has pushed its gradient and "
                "waits for your reply. Receive exactly one gradient per worker: "
                f"world_size - 1 = {len(self.workers)} of them (rank 0 is the server and "
                "pushes none)")
        if not held:
            raise ProtocolError(
                f"ssp_serve waits for a push that can never come: every worker has pushed its "
                f"{self.steps} steps and had its reply. Return once every worker has pushed "
                f"steps = {self.steps} times and every push has been answered")
        raise ProtocolError(
            f"ssp_serve waits for a push that can never come: each worker has pushed its "
            f"{self.steps} steps or waits for your reply (workers {waiting} wait)")

    # -- replies ----------------------------------------------------------------------------
    def isend(self, tensor, dst: int, tag: int = 0):
        if dst not in self.replies:
            raise ProtocolError(f"the server sent a message to rank {dst}, which is not a "
                                f"worker: the workers are ranks 1 to {len(self.workers)}")
        if self.pushes[dst] == self.replies[dst]:
            raise ProtocolError(self._not_owed(dst))
        if self.staleness is None:
            self._check_sync_reply(dst, tensor)
        else:
            self._check_ssp_reply(dst, tensor)
        self.replies[dst] += 1
        return Watched(self, self._isend(tensor, dst, tag), receive=False)

    def _not_owed(self, w: int) -> str:
        if self.pushes[w] == 0 or self.staleness is None and self.pushes[w] == self.step:
            return (f"the server sent parameters to worker {w} before receiving its gradient "
                    f"of step {self.pushes[w] + 1}: reply to a push, once it has arrived")
        return (f"worker {w} was answered twice for its push of step {self.pushes[w]}: it "
                "waits for one reply per push, and a second one would be taken as the answer "
                "to its next push. Send each worker exactly one reply per push")

    def _check_sync_reply(self, w: int, tensor) -> None:
        arrived = sum(self.pushes.values()) - len(self.workers) * self.step
        if arrived < len(self.workers):
            raise ProtocolError(
                f"in step {self.step + 1} the server replied to worker {w} when only "
                f"{arrived} of the {len(self.workers)} gradients had arrived: a synchronous "
                "step replies with the parameters after the update, which needs every "
                "worker's gradient. Receive them all first, then update, then reply")
        grads = torch.stack([gradient(v, self.step) for v in self.workers])
        want = self.step_start - self.lr * grads.mean(0)
        if not _close(tensor, want):
            raise ProtocolError(f"in step {self.step + 1} the parameters sent to worker {w} "
                                f"are wrong: {self._sync_hint(tensor, grads)}")

    def _sync_hint(self, tensor, grads) -> str:
        got = as_double(tensor)
        if got is None:
            return f"a tensor of {DIM} float64 values was expected"
        return sync_hint(got, self.step_start, grads, self.lr, TOLERANCE)

    def _check_ssp_reply(self, w: int, tensor) -> None:
        lead = self._lead(w)
        if lead > self.staleness:
            raise ProtocolError(
                f"worker {w} was let go to start its step {self.pushes[w] + 1} (clock "
                f"{self.pushes[w]}) while the slowest worker had pushed only "
                f"{times(self._slowest())} (clock {self._slowest()}): {_steps(lead)} ahead, "
                f"more than s = {self.staleness}. A worker at clock c may go only if "
                "c - min(clocks) <= s; hold its reply until the slowest catches up")
        self.lead = max(self.lead, lead)
        if not _close(tensor, self.expected):
            raise ProtocolError(f"the parameters sent to worker {w} are wrong: "
                                f"{self._ssp_hint(tensor)}")

    def _ssp_hint(self, tensor) -> str:
        got = as_double(tensor)
        if got is None:
            return f"a tensor of {DIM} float64 values was expected"
        pushes = (self._applied(), len(self.workers),
                  lambda w, k: self.expected + self.lr * gradient(w, k))
        hint = ssp_mistakes(got, initial(), self.expected, pushes, TOLERANCE, gradient)
        return hint or (f"they differ by up to {(got - self.expected).abs().max().item():.3g} "
                        "from the initial parameters minus lr times every gradient received "
                        "so far")

    def _applied(self) -> list[tuple[int, int]]:
        return [(w, k) for w in self.workers for k in range(self.pushes[w])]

    def _lead(self, w: int) -> int:
        return self.pushes[w] - self._slowest()

    def _slowest(self) -> int:
        return min(self.pushes.values())

    # -- the end of a call ------------------------------------------------------------------
    def after_sync_step(self, params) -> None:
        for w in self.workers:
            if self.replies[w] < self.step + 1:
                raise ProtocolError(
                    f"sync_step returned in step {self.step + 1} without answering worker "
                    f"{w}, which now waits forever: send the new parameters to every worker, "
                    "once")
        grads = torch.stack([gradient(v, self.step) for v in self.workers])
        want = self.step_start - self.lr * grads.mean(0)
        if not _close(params, want):
            raise ProtocolError(
                f"after step {self.step + 1} the workers have the new parameters but the "
                "server's params do not: update params in place (params -= ..., or "
                "params.copy_(...)); a new tensor bound to the name params is lost when "
                "sync_step returns, and the next step starts from the old values")
        self.step, self.step_start = self.step + 1, want

    def after_serve(self) -> None:
        for w in self.workers:
            if self.pushes[w] < self.steps:
                raise ProtocolError(f"ssp_serve returned when worker {w} had pushed "
                                    f"{self.pushes[w]} of its {self.steps} steps: return only "
                                    "once every worker has pushed steps times and every push "
                                    "has had its reply")
        for w in self.workers:  # every worker has pushed steps times: the rule admits all
            if self.replies[w] < self.pushes[w]:
                raise ProtocolError(
                    f"ssp_serve returned while worker {w} still waits for its reply to the "
                    f"push of step {self.pushes[w]}, although the rule lets it go (every "
                    "clock is at steps now): after every push, reply to each worker you hold "
                    "that the rule admits (to remove workers from the list you walk, walk a "
                    "copy, list(held): removing from the list itself skips the next one)")


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def as_double(t) -> torch.Tensor | None:
    """A reply of DIM values as a flat float64 tensor (its shape is not judged); else None."""
    if not isinstance(t, torch.Tensor) or t.numel() != DIM:
        return None
    return t.detach().reshape(-1).double()


def _close(t, want) -> bool:
    return close(as_double(t), want, TOLERANCE)
