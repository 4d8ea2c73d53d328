"""Exercise 03's :class:`Probe`: it watches every message the learner's server sends and
receives, as it happens (the ranks' case functions are in ``param_server.py``).

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

import torch

from ...comm.communicator import ANY_SOURCE

DIM, LR, DELAY = 8, 0.5, 0.03  # parameters; learning rate; the straggler's sleep (s)
TOLERANCE = 1e-12


class ProtocolError(RuntimeError):
    """The learner's server broke the parameter server's protocol."""


def gradient(worker: int, step: int) -> torch.Tensor:
    """Worker ``worker``'s push at step ``step``: fixed, multiples of 1/64, float64."""
    g = torch.Generator().manual_seed(1000 * worker + step)
    return torch.round(torch.randn(DIM, generator=g, dtype=torch.float64) * 64) / 64


def initial() -> torch.Tensor:
    return torch.linspace(-1, 1, DIM, dtype=torch.float64)


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
                        "else it waits forever")
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
                                f"are wrong: {sync_hint(tensor, self.step_start, grads, self.lr)}")

    def _check_ssp_reply(self, w: int, tensor) -> None:
        lead = self._lead(w)
        if lead > self.staleness:
            raise ProtocolError(
                f"worker {w} was let go to start its step {self.pushes[w] + 1} (clock "
                f"{self.pushes[w]}) while the slowest worker had pushed only "
                f"{_times(self._slowest())} (clock {self._slowest()}): {_steps(lead)} ahead, "
                f"more than s = {self.staleness}. A worker at clock c may go only if "
                "c - min(clocks) <= s; hold its reply until the slowest catches up")
        self.lead = max(self.lead, lead)
        if not _close(tensor, self.expected):
            raise ProtocolError(f"the parameters sent to worker {w} are wrong: "
                                f"{self._ssp_hint(tensor)}")

    def _ssp_hint(self, tensor) -> str:
        got = _as_double(tensor)
        if got is None:
            return f"a tensor of {DIM} float64 values was expected"
        applied = self._applied()
        for w, k in applied:
            if _close(got, self.expected + self.lr * gradient(w, k)):
                return (f"they miss the gradient worker {w} pushed at step {k + 1}: apply "
                        "each push (params -= lr * grad) as soon as it arrives, before "
                        "replying")
        total = initial() - self.expected
        for n in {len(self.workers), len(self.workers) + 1}:
            if _close(got, initial() - total / n):
                return (f"each push was divided by {n}: in asynchronous training there is "
                        "no step to average over; apply each push alone, "
                        "params -= lr * grad")
        return (f"they differ by up to {(got - self.expected).abs().max().item():.3g} from "
                "the initial parameters minus lr times every gradient received so far")

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
            if self.replies[w] < self.pushes[w]:
                raise ProtocolError(f"ssp_serve returned while worker {w} still waits for "
                                    f"its reply to the push of step {self.pushes[w]}")


def sync_hint(got, start, grads, lr) -> str:
    """What the parameters sent back are, in terms of this step's gradients."""
    got, n = _as_double(got), grads.shape[0]
    if got is None:
        return f"a tensor of {DIM} float64 values was expected"
    if _close(got, start):
        return "they are the parameters before the update: update first, then reply"
    weights = torch.linalg.lstsq(grads.T, (start - got) / lr).solution
    if not _close(start - lr * (grads.T @ weights), got):
        err = (got - (start - lr * grads.mean(0))).abs().max().item()
        return (f"they differ from params - lr * (the average of the {n} gradients) by up to "
                f"{err:.3g}, and are not params - lr * (any mix of this step's gradients)")
    if torch.allclose(weights, torch.full((n,), 1.0 / (n + 1), dtype=weights.dtype)):
        return (f"the gradients were averaged over world_size = {n + 1}, but only the {n} "
                "workers (ranks 1 and up) push one; rank 0 is the server: divide by "
                "world_size - 1")
    if n > 1 and torch.allclose(weights, torch.ones(n, dtype=weights.dtype)):
        return (f"they hold the sum of the {n} gradients, {n} times the average: divide by "
                "the number of workers")
    counts = ", ".join(f"worker {w + 1}'s gradient {_times(round(c * n, 3))}" for w, c in
                       enumerate(weights.tolist()))
    return (f"over the {n} workers, the update counts {counts}; expected each worker's "
            "gradient once (did one receive buffer overwrite another, or a gradient come in "
            "twice?)")


def _times(n) -> str:
    n = int(n) if float(n).is_integer() else n
    return "once" if n == 1 else f"{n:g} times"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _as_double(t) -> torch.Tensor | None:
    if not isinstance(t, torch.Tensor) or t.numel() != DIM:
        return None
    return t.detach().reshape(-1).double()


def _close(t, want) -> bool:
    got = _as_double(t)
    return got is not None and torch.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)
