"""What runs on each rank in exercise 02's stage tests: the model, the data, and a
:class:`Recorder` of every ``md.all_reduce`` call the learner's hooks make; and the sampler
test's reference, torch's own ``DistributedSampler``.

The recorder makes the timing questions deterministic instead of racing the clock:

- a layer of the test model (``Gate``) waits in its backward until the first all-reduce has
  started (at most ``GATE_WAIT`` s), so a version that starts the first bucket during
  backward always does so before the earlier layers' gradients exist;
- the first all-reduce that runs on a worker thread waits until backward has produced one
  more gradient (at most ``PROGRESS_WAIT`` s): if backward does not move on, the hook that
  handed the bucket over is waiting for it;
- every all-reduce on a worker thread starts ``LATE`` s late, so a version whose backward
  returns without waiting for its thread is seen with unaveraged gradients.
"""

from __future__ import annotations

import threading
import time

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from ....collectives import api
from ...engine.sandbox import observe

BATCH, STEPS = 12, 2  # samples per step (divisible by the world sizes); backward passes
GATE_WAIT, PROGRESS_WAIT, LATE, SETTLE = 1.0, 2.0, 0.05, 5.0  # seconds
NAMES = {"hooks": "register_allreduce_hooks", "buckets": "register_bucket_hooks",
         "overlap": "register_overlapped_hooks"}


def torch_sampler(n, rank, p, shuffle, seed, epoch):
    """The reference shards: torch's own sampler, at ``epoch``."""
    sampler = DistributedSampler(range(n), num_replicas=p, rank=rank, shuffle=shuffle,
                                 seed=seed)
    sampler.set_epoch(epoch)
    return sampler


class _WaitForFirstBucket(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, started):
        ctx.started = started
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.started.wait(GATE_WAIT)
        return grad, None


class Gate(nn.Module):
    """The identity; with ``started`` (an event) set, its backward waits for the event."""

    def __init__(self):
        super().__init__()
        self.started = None

    def forward(self, x):
        return x if self.started is None else _WaitForFirstBucket.apply(x, self.started)


def stage_model(frozen: bool = False) -> nn.Sequential:
    """8 parameters of distinct sizes (40, 8, 64, 8, 48, 6, 18, 3); the gate sits between the
    last layer and the rest. ``frozen``: the first layer's bias takes no gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 6), Gate(), nn.Tanh(), nn.Linear(6, 3)).double()
    if frozen:
        model[0].bias.requires_grad_(False)
    return model


def batch(step: int):
    g = torch.Generator().manual_seed(1 + step)
    return (torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=g, dtype=torch.float64))


class Recorder:
    """Every ``md.all_reduce`` call of this rank in the current backward pass: its size,
    whether it ran on the thread that runs backward, and how many gradients backward had
    produced when it started (see the module docstring for the waits)."""

    def __init__(self, params):
        self.params, self.main = params, threading.get_ident()
        self.started, self.lock = threading.Event(), threading.Lock()
        self.stalled = False  # backward was seen stopped once: do not wait for it again
        self.start()

    def start(self) -> None:
        self.calls, self.running, self.finished = [], 0, 0
        self.started.clear()

    def ready(self) -> int:
        return sum(p.grad is not None for p in self.params)

    def around(self, original, comm, t, *args, **kwargs):
        ident = threading.get_ident()
        call = {"numel": _numel(t), "main": ident == self.main,  # a name is never reused:
                "thread": f"{threading.current_thread().name}:{ident}",  # an ident may be
                "ready": self.ready(), "progressed": None}
        with self.lock:
            first = not self.calls
            self.calls.append(call)
            self.running += 1
        self.started.set()
        try:
            if not call["main"]:
                if first:
                    call["progressed"] = self._progress(call["ready"])
                time.sleep(LATE)
            return original(comm, t, *args, **kwargs)
        finally:
            with self.lock:
                self.running, self.finished = self.running - 1, self.finished + 1

    def _progress(self, ready: int) -> bool | None:
        """True once backward produces another gradient; False if it does not (in time)."""
        if self.stalled or ready >= len(self.params):
            return None
        deadline = time.monotonic() + PROGRESS_WAIT
        while time.monotonic() < deadline:
            if self.ready() > ready:
                return True
            time.sleep(0.001)
        self.stalled = True
        return False

    def settle(self, expected: int) -> list[dict]:
        """The calls, once none is running and a worker thread made all ``expected`` (or
        after ``SETTLE`` s): the next backward starts on a quiet communicator."""
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            with self.lock:
                threaded = any(not c["main"] for c in self.calls)
                if self.running == 0 and (not threaded or len(self.calls) >= expected):
                    break
            time.sleep(0.005)
        with self.lock:
            return [dict(c) for c in self.calls]


def _numel(t) -> int:
    try:
        return int(torch.as_tensor(t).numel())
    except (TypeError, ValueError, RuntimeError):
        return -1


def stage_case(comm, namespace, stage: str, buckets, slow: bool) -> list[dict]:
    """One rank: register the learner's hooks, run ``STEPS`` backward passes on this rank's
    shard; after each, the gradients and the all-reduces."""
    model = stage_model(frozen=stage == "hooks")
    record = Recorder([p for p in model.parameters() if p.requires_grad])
    if slow:
        model[5].started = record.started
    observe(api.all_reduce, record.around)
    register = namespace[NAMES[stage]]
    if buckets is None:
        register(model, comm)
    else:
        register(model, comm, [list(b) for b in buckets])
    expected = len(record.params) if buckets is None else len(buckets)
    lo, hi = comm.rank * BATCH // comm.world_size, (comm.rank + 1) * BATCH // comm.world_size
    out = []
    for step in range(STEPS):
        x, y = batch(step)
        model.zero_grad(set_to_none=True)
        record.start()
        nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
        finished = record.finished  # all-reduces done when backward returned
        grads = {n: None if p.grad is None else p.grad.clone()
                 for n, p in model.named_parameters()}
        out.append({"grads": grads, "calls": record.settle(expected), "finished": finished})
    return out
