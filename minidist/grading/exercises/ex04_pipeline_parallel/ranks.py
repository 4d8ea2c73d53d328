"""What runs on each rank in exercise 04's stage tests (``stages.py``): the stages' modules,
the data, the reference schedules, the test's own halves of a stage, one case on one rank
(:func:`stage_case`), and the learner's halves, run through :class:`StageComm`, the
communicator they talk to, which stops a message to or from the wrong neighbour, or a
blocking send, on the spot and says what is wrong; their results are then checked for what
the next step needs.

The test's own ``forward`` and ``backward`` send with ``comm.send``, which (at the grader's
eager limit of 0) returns only once the neighbour has received: a strict partner. Paired
with it, the learner's half alone must keep two neighbours from waiting in a send to each
other, as on a cluster where large messages are not buffered.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ....comm import ANY_SOURCE

D = 3  # features of every activation


class StageMistake(RuntimeError):
    """The learner's step did something a stage must not do; the message says what."""


def reference_1f1b(rank: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B on stage ``rank``: a warm-up of min(p - r - 1, m) forwards; then one forward and
    the oldest micro-batch's backward, until every forward has run; then the cool-down's
    backwards (PipeDream-Flush, Narayanan et al. 2021)."""
    warmup = min(stages - rank - 1, microbatches)
    out = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        out += [("F", i), ("B", i - warmup)]
    return out + [("B", i) for i in range(microbatches - warmup, microbatches)]


def reference_gpipe(rank: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """GPipe (Huang et al. 2019): every forward, then every backward."""
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


SCHEDULES = {"1f1b": reference_1f1b, "gpipe": reference_gpipe}


def stage_module(rank: int, stages: int) -> nn.Module:
    """Stage ``rank``'s part of the test model, the same in every process. With three stages
    or more, stage 1 has no parameters: it must still pass gradients on."""
    torch.manual_seed(10 + rank)
    if rank == 1 and stages >= 3:
        return nn.Tanh()
    return nn.Sequential(nn.Linear(D, D), nn.Tanh()).double()


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return (torch.randn(n, D, generator=g, dtype=torch.float64),
            torch.randn(n, D, generator=g, dtype=torch.float64))


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


# -- the test's own halves: blocking sends -----------------------------------------------------
def forward(comm, module, x, pending):
    r, p = comm.rank, comm.world_size
    if r > 0:
        comm.recv(x, r - 1)
        x.requires_grad_()
    out = module(x)
    if r < p - 1:
        comm.send(out.detach(), r + 1)
    return x, out


def backward(comm, inp, out, pending):
    r, p = comm.rank, comm.world_size
    if r < p - 1:
        grad = torch.empty_like(out)
        comm.recv(grad, r + 1)
        out.backward(grad)
    else:
        out.backward()
    if r > 0:
        if inp.grad is None:
            raise StageMistake(
                f"on stage {r}, the input forward_step returned has no gradient after "
                "backward: the module did not run on it. Mark the received tensor "
                ".requires_grad_() before the module runs, and return that same tensor as inp")
        comm.send(inp.grad, r - 1)


# -- the learner's halves, watched ----------------------------------------------------------
_WAY = {("forward_step", "recv"): -1, ("forward_step", "send"): 1,
        ("backward_step", "recv"): 1, ("backward_step", "send"): -1}
_WHY = {
    ("forward_step", "recv"): "the activation comes from the previous stage",
    ("forward_step", "send"): "the activation goes forward, to the next stage",
    ("backward_step", "recv"): "the gradient of this stage's output comes from the next stage",
    ("backward_step", "send"): "the gradient of this stage's input goes back to the previous "
                               "stage",
}
_NONE = {
    ("forward_step", "recv"): "stage 0 receives nothing: its x is the micro-batch itself",
    ("forward_step", "send"): "the last stage sends nothing forward: its output goes into "
                              "the loss",
    ("backward_step", "recv"): "the last stage receives no gradient: its backward starts "
                               "from the loss (out is the loss there)",
    ("backward_step", "send"): "stage 0 sends no gradient back: no stage comes before it",
}


class StageComm:
    """The communicator as a step function sees it: every point-to-point call goes to
    ``comm`` once it is checked to talk to the neighbour this step talks to; the isends
    are counted, to be found in ``pending``."""

    def __init__(self, comm, step: str, pending: list):
        self.comm, self.step, self.pending = comm, step, pending
        self.before, self.isends = len(pending), 0
        self.sent: list[torch.Tensor] = []  # what it sent, as it was when sent
        self._sending: list[torch.Tensor] = []  # the tensors themselves, to stay as they were

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def send(self, tensor, dst, tag=0):
        self._check("send", dst, tensor)
        r = self.comm.rank
        what, back = (("activation", "gradient") if self.step == "forward_step"
                      else ("gradient", "activation"))
        raise StageMistake(
            f"on stage {r}, {self.step} sends with comm.send, which returns only once rank "
            f"{dst} has received the message. In a pipeline neighbours send to each other: "
            f"while stage {r} waits in its send of a micro-batch's {what}, rank {dst} may be "
            f"waiting in its own send of another micro-batch's {back} to stage {r}, and "
            "neither receives: a deadlock (1F1B does this in its steady phase). Send with "
            "comm.isend, append the request to pending and return: the step waits for every "
            "request at its end")

    def isend(self, tensor, dst, tag=0):
        self._check("send", dst, tensor)
        self.isends += 1
        self.sent.append(tensor.detach().clone())
        self._sending.append(tensor)
        return self.comm.isend(tensor, dst, tag)

    def recv(self, tensor, src=ANY_SOURCE, tag=0):
        self._check("recv", src, tensor)
        return self.comm.recv(tensor, src, tag)

    def irecv(self, tensor, src=ANY_SOURCE, tag=0):
        self._check("recv", src, tensor)
        return self.comm.irecv(tensor, src, tag)

    def sendrecv(self, *args, **kwargs):
        raise StageMistake(f"{self.step} calls comm.sendrecv: a step receives from one "
                           "neighbour and sends to the other; use comm.recv and comm.isend")

    def _check(self, way: str, peer, tensor) -> None:
        r, p, key = self.comm.rank, self.comm.world_size, (self.step, way)
        head = f"on stage {r} of {p}, {self.step} {'sends' if way == 'send' else 'receives'}"
        want = r + _WAY[key]
        if not 0 <= want < p:  # first: a message a stage must not exchange at all
            raise StageMistake(f"{head} {'to' if way == 'send' else 'from'} rank {peer}, but "
                               f"{_NONE[key]}")
        if not isinstance(tensor, torch.Tensor):
            hint = (": the gradient to send back is inp.grad, which backward fills in "
                    "(autograd keeps .grad only on leaf tensors such as inp, not on out)"
                    if tensor is None and key == ("backward_step", "send") else "")
            raise StageMistake(f"{head} {type(tensor).__name__} (not a tensor) "
                               f"{'to' if way == 'send' else 'from'} rank {peer}{hint}")
        if peer == ANY_SOURCE:  # -1: also stage 0's r - 1
            raise StageMistake(f"{head} from md.ANY_SOURCE (-1): {_WHY[key]}, rank {want}; "
                               "name the neighbour (a middle stage hears from both "
                               "neighbours, and from any rank it could take the other one's "
                               "message)")
        if peer != want:
            raise StageMistake(f"{head} {'to' if way == 'send' else 'from'} rank {peer}: "
                               f"{_WHY[key]}, rank {want}")

    def check_sent(self) -> None:
        """A step that should have sent its message did so (else its neighbour waits)."""
        r, p = self.comm.rank, self.comm.world_size
        to = r + _WAY[(self.step, "send")]
        what = "its output" if self.step == "forward_step" else "the gradient of its input"
        if 0 <= to < p and not self.isends:
            raise StageMistake(f"on stage {r}, {self.step} returned without sending {what} to "
                               f"rank {to}, which waits for it")
        if self.isends > 1:
            raise StageMistake(f"on stage {r}, one call of {self.step} sent {self.isends} "
                               f"messages to rank {to}: send {what} once, one message per "
                               f"micro-batch (rank {to} receives one; the next would be "
                               "taken for the next micro-batch's)")
        changed = next((k for k, (t, c) in enumerate(zip(self._sending, self.sent))
                        if not (t.shape == c.shape and torch.equal(t.detach(), c))), None)
        if changed is not None:
            thing = "output" if self.step == "forward_step" else "gradient"
            raise StageMistake(f"on stage {r}, {self.step} changed the {thing} it sent "
                               "before the send completed (it returned with the "
                               "isend still in flight): until the step waits for the "
                               "request, the tensor must stay as it is; leave it alone, or "
                               "send a copy")

    def check_pending(self) -> None:
        self.check_sent()
        added = self.pending[self.before:]
        wrong = next((x for x in added if not callable(getattr(x, "wait", None))), None)
        if wrong is not None:
            raise StageMistake(f"pending holds a {type(wrong).__name__}: append the request "
                               "that comm.isend returns")
        if self.isends > len(added):
            raise StageMistake(
                f"on stage {self.comm.rank}, {self.step} started {self.isends} isend(s) but "
                f"put {len(added)} request(s) in pending: append each request comm.isend "
                "returns to pending, so that the step waits for it before it ends (until "
                "then the tensor must stay as it is)")


def their_forward(fn, comm, module, x, pending):
    watched = StageComm(comm, "forward_step", pending)
    got = fn(watched, module, x, pending)
    watched.check_pending()
    r = comm.rank
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and
            all(isinstance(t, torch.Tensor) for t in got)):
        raise StageMistake(f"on stage {r}, forward_step returned {got!r:.60}; expected "
                           "(inp, out): the tensor the module ran on and its output")
    inp, out = got
    if r > 0 and not inp.requires_grad:
        raise StageMistake(
            f"on stage {r}, the input forward_step returned does not require a gradient, so "
            f"backward cannot compute the gradient stage {r - 1} waits for. Call "
            ".requires_grad_() on the received activation before the module runs, and "
            "return it as inp")
    if not out.requires_grad:
        raise StageMistake(f"on stage {r}, the output forward_step returned is not part of "
                           "autograd's graph (computed under torch.no_grad(), or detached): "
                           "backward_step cannot run backward from it")
    return inp, out


def their_backward(fn, comm, inp, out, pending) -> torch.Tensor | None:
    """The learner's backward_step; returns the gradient it sent back (None on stage 0)."""
    watched = StageComm(comm, "backward_step", pending)
    fn(watched, inp, out, pending)
    watched.check_pending()
    return watched.sent[0] if watched.sent else None


# -- one case on one rank ----------------------------------------------------------------------
def stage_case(comm, namespace, part: str, schedule: str, m: int, n: int) -> dict:
    """One rank runs ``schedule``'s actions on a batch of ``n`` in ``m`` micro-batches: the
    learner's ``forward_step`` with the test's backward (part "forward"), the test's forward
    with the learner's ``backward_step`` ("backward"), or the learner's ``pipeline_step``
    ("step"). Returns what the stage computed, for the parent to judge."""
    r, p = comm.rank, comm.world_size
    module, (x, y) = stage_module(r, p), batch(n)
    acts = SCHEDULES[schedule](r, p, m)
    if part == "step":
        return _step_case(comm, namespace["pipeline_step"], module, acts, m, (x, y))
    fwd = partial(their_forward, namespace["forward_step"]) if part == "forward" else forward
    bwd = partial(their_backward, namespace["backward_step"]) if part == "backward" \
        else backward
    xs, ys = x.tensor_split(m), y.tensor_split(m)
    pending, kept = [], {}
    rec = {"inputs": [None] * m, "outs": [None] * m, "in_grads": [None] * m}
    for kind, i in acts:
        if kind == "F":
            buf = xs[i].clone() if r == 0 else torch.empty(len(xs[i]), D, dtype=torch.float64)
            inp, out = fwd(comm, module, buf, pending)
            rec["inputs"][i], rec["outs"][i] = inp.detach().clone(), out.detach().clone()
            kept[i] = (inp, loss_fn(out, ys[i]) * len(xs[i]) / n if r == p - 1 else out)
        else:
            inp, out = kept.pop(i)
            sent = bwd(comm, inp, out, pending)
            rec["in_grads"][i] = sent if part == "backward" else None
    for req in pending:
        req.wait()
    return {**rec, "grads": _grads(module)}


def _grads(module) -> dict:
    return {name: None if q.grad is None else q.grad.clone()
            for name, q in module.named_parameters()}


class _Mark(torch.autograd.Function):
    """The identity; its backward notes "B" in the log."""

    @staticmethod
    def forward(ctx, x, log):
        ctx.log = log
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append("B")
        return grad, None


class Logged(nn.Module):
    """A stage's module that notes "F" for each forward and "B" for each backward."""

    def __init__(self, inner: nn.Module, log: list):
        super().__init__()
        self.inner, self.log = inner, log

    def forward(self, x):
        self.log.append("F")
        return _Mark.apply(self.inner(x), self.log)


class SendsKept:
    """``comm`` as the learner's ``pipeline_step`` sees it, keeping every request its
    ``isend`` returns: the spec says the step waits for all of them before it returns (until
    then the sent tensor must not change, and the stage may not reuse it)."""

    def __init__(self, comm):
        self._comm, self.sends = comm, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def isend(self, *args, **kwargs):
        req = self._comm.isend(*args, **kwargs)
        self.sends.append(req)
        return req

    def recv(self, tensor, src=ANY_SOURCE, tag=0):
        self._named(src)
        return self._comm.recv(tensor, src, tag)

    def irecv(self, tensor, src=ANY_SOURCE, tag=0):
        self._named(src)
        return self._comm.irecv(tensor, src, tag)

    def _named(self, src) -> None:
        """A receive from md.ANY_SOURCE (-1) races: a middle stage hears from both sides."""
        if src == ANY_SOURCE:
            raise StageMistake(
                f"on stage {self._comm.rank}, pipeline_step receives from md.ANY_SOURCE (-1): "
                "name the neighbour (activations come from rank - 1, gradients from rank + 1; "
                "stage 0 receives no activation); from any rank a middle stage could take "
                "the other neighbour's message")

    def check_waited(self) -> None:
        # _finished: set by the request's own wait() or a test() that saw it done, so only
        # by the learner's code here (the grader has not touched these requests)
        open_ = [req for req in self.sends if not getattr(req, "_finished", True)]
        if open_:
            raise StageMistake(
                f"on stage {self._comm.rank}, pipeline_step returned with {len(open_)} of its "
                f"{len(self.sends)} isend(s) never waited for (the first to rank "
                f"{open_[0].peer}): wait for every request in pending before returning, as "
                "the spec says (until a send completes its tensor must stay as it is)")


def _step_case(comm, fn, module, acts, m, data) -> dict:
    r, p = comm.rank, comm.world_size
    x, y = data
    log: list[str] = []
    buf = x.clone() if r == 0 else torch.empty_like(x)
    kept = SendsKept(comm)
    loss = fn(kept, Logged(module, log), list(acts), m, buf, y.clone() if r == p - 1 else None,
              loss_fn)
    kept.check_waited()
    return {"loss": loss if r == p - 1 else None, "log": log, "grads": _grads(module)}
