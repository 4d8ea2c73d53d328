"""The learner's step functions as exercise 04's stage tests run them
(``pipeline_probe.py``): through :class:`StageComm`, the communicator they talk to, which
stops a message to or from the wrong neighbour, or a blocking send, on the spot and says
what is wrong; then their results are checked for what the next step needs.
"""

from __future__ import annotations

import torch

from ...comm import ANY_SOURCE


class StageMistake(RuntimeError):
    """The learner's step did something a stage must not do; the message says what."""


# -- the learner's halves, watched -------------------------------------------------------------
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
        if not isinstance(tensor, torch.Tensor):
            hint = (": the gradient to send back is inp.grad, which backward fills in "
                    "(autograd keeps .grad only on leaf tensors such as inp, not on out)"
                    if tensor is None and key == ("backward_step", "send") else "")
            raise StageMistake(f"{head} {type(tensor).__name__} (not a tensor) "
                               f"{'to' if way == 'send' else 'from'} rank {peer}{hint}")
        want = r + _WAY[key]
        if not 0 <= want < p:
            raise StageMistake(f"{head} {'to' if way == 'send' else 'from'} rank {peer}, but "
                               f"{_NONE[key]}")
        if peer == ANY_SOURCE:
            raise StageMistake(f"{head} from md.ANY_SOURCE: name the neighbour, rank {want} "
                               "(a middle stage hears from both neighbours, and from any "
                               "rank it could take the other one's message)")
        if peer != want:
            raise StageMistake(f"{head} {'to' if way == 'send' else 'from'} rank {peer}: "
                               f"{_WHY[key]}, rank {want}")

    def check_sent(self) -> None:
        """A step that should have sent its message did so (else its neighbour waits)."""
        r, p = self.comm.rank, self.comm.world_size
        to = r + _WAY[(self.step, "send")]
        if 0 <= to < p and not self.isends:
            what = "its output" if self.step == "forward_step" else "the gradient of its input"
            raise StageMistake(f"on stage {r}, {self.step} returned without sending {what} to "
                               f"rank {to}, which waits for it")

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
