"""The messages between neighbouring pipeline stages: activations forward to stage s + 1,
gradients back to stage s - 1, and what a receiver needs to allocate its buffer.

After Megatron-LM core's ``pipeline_parallel/p2p_communication.py`` (``recv_forward``,
``send_forward``, ``recv_backward``, ``send_backward``; its ``_communicate_shapes`` is the
header here), for one virtual stage on an explicit communicator instead of globals. The
stage (``stage.py``) only computes; :class:`P2PCommunicator` is everything it says to its
neighbours.

Shapes. A receiver must allocate its buffer before the message arrives. In every step each
stage tells the next one, ahead of its first activation, whether shapes changed since the
last step (the *flag*: one small message per link and step; stage 0 decides from its input).
If they did, every activation travels after a *header* (dtype and shape) and the receiver
remembers the shapes; if not, the receiver allocates from memory and can post its receive
early (:meth:`P2PCommunicator.prefetch_forward`), so the message lands while the stage
computes. A gradient always has the shape of the activation it belongs to, which the stage
itself sent, so it never needs a header: :meth:`P2PCommunicator.send_forward` posts its
receive at once. Sends are ``isend``, waited for only at the end of the step
(:meth:`P2PCommunicator.wait_sends`): a stage never stalls on its own send. Every
message travels on the communicator's strategy channel (``comm.strategy``), apart from
the user's messages and the collectives' (``comm/contexts.py``).

Wire format (what the grader and the benches count), on ``comm.strategy``:

    flag        int64 [1]            1: headers follow this step     tag(-1, FLAG, dest)
    header      int64 [2 + 8]        dtype index, ndim, shape, 0s    tag(i, HEADER, dest)
    activation  the output of stage s, contiguous                    tag(i, ACT, dest)
    gradient    the gradient of stage s's input, contiguous          tag(i, GRAD, dest)

Devices. Every buffer this module allocates, and every flag and header it sends, is on the
stage's device, as Megatron allocates on the current CUDA device: a CUDA stage after the
first receives CUDA tensors, and on NCCL every message is a CUDA tensor (the Communicator
stages CUDA tensors through host memory on the other transports).
"""

from __future__ import annotations

import itertools

import torch

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.bool)
_MAX_DIMS = 8
ACT, GRAD, HEADER, FLAG = 0, 1, 2, 3


def tag(microbatch: int, kind: int, dest: int, num_stages: int) -> int:
    """The tag of micro-batch ``microbatch``'s activation, gradient or header for virtual
    stage ``dest`` (``microbatch=-1``: the step's shape flag). Distinct for every message
    of a step, so two chunks' messages between the same two ranks never meet."""
    return 4 * ((microbatch + 1) * num_stages + dest) + kind


def shape_header(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The header that goes ahead of activation ``t``: dtype index, ndim, shape, zero-padded."""
    if t.dim() > _MAX_DIMS or t.dtype not in _DTYPES:
        raise TypeError(f"a stage output must be a tensor of at most {_MAX_DIMS} dimensions "
                        f"and one of {_DTYPES}, got {t.dtype} of shape {tuple(t.shape)}")
    values = [_DTYPES.index(t.dtype), t.dim(), *t.shape] + [0] * (_MAX_DIMS - t.dim())
    return torch.tensor(values, dtype=torch.int64, device=device)


def read_header(h: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) from a header made by :func:`shape_header`."""
    values = h.tolist()
    return tuple(values[2:2 + values[1]]), _DTYPES[values[0]]


def stage_device(submodule: torch.nn.Module, comm, device=None) -> torch.device:
    """Where a stage's messages live: ``device`` if given, else its submodule's (first
    parameter or buffer), else the communicator's (a stage with no parameters, a Tanh)."""
    if device is not None:
        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device={device!r} is not a torch device ({e}); pass e.g. "
                             f"'cpu', 'cuda:0' or a torch.device") from None
    first = next(itertools.chain(submodule.parameters(), submodule.buffers()), None)
    return first.device if first is not None else torch.device(getattr(comm, "device", "cpu"))


class P2PCommunicator:
    """Virtual stage ``stage_index`` of ``num_stages``'s messages on ``comm``: it receives
    from stage s - 1 on rank (s - 1) mod p and sends to stage s + 1 on rank (s + 1) mod p,
    with every buffer on ``device``. Call :meth:`begin_step` before a step's first message
    and :meth:`wait_sends` after its last."""

    def __init__(self, comm, stage_index: int, num_stages: int, device: torch.device):
        self.comm, self.device = comm, torch.device(device)
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        p = comm.world_size
        self.prev_rank, self.next_rank = (stage_index - 1) % p, (stage_index + 1) % p
        self.headers: bool | None = None  # do this step's activations carry headers?
        self._flag_recv: tuple | None = None  # (request, buffer) while headers is None
        self._flag_owed = False  # the step's flag is yet to go to stage s + 1
        self._shapes: dict[int, tuple] = {}  # micro-batch -> (shape, dtype) last received
        self._recvs: dict[tuple[int, int], tuple] = {}  # (kind, micro-batch) -> (req, buf)
        self._sends: list = []
        self._stepped = False

    def __repr__(self) -> str:
        return (f"P2PCommunicator(stage {self.stage_index} of {self.num_stages}, "
                f"device={str(self.device)!r})")

    # -- the step's shape flag --------------------------------------------------------------
    def begin_step(self, changed: bool = False) -> None:
        """Start a step; on the first stage ``changed`` says the input shapes changed (the
        first step always sends headers). Other stages post the flag's receive: it comes
        ahead of stage s - 1's first activation and is read when it is needed."""
        self._flag_owed = not self.is_last
        if self.is_first:
            self.headers = bool(changed) or not self._stepped
        else:
            self.headers, buf = None, self._empty(1, torch.int64)
            flag = self.comm.strategy.irecv(buf, self.prev_rank, self._tag(-1, FLAG, 0))
            self._flag_recv = (flag, buf)
        self._stepped = True

    def _flag_arrived(self, block: bool) -> bool:
        """Read this step's flag if it is here (``block``: wait for it); whether it was."""
        if self.headers is None:
            req, buf = self._flag_recv
            if not block and not req.test():
                return False
            req.wait()
            self.headers, self._flag_recv = bool(buf.item()), None
        return True

    # -- forward: activations ---------------------------------------------------------------
    def send_forward(self, output: torch.Tensor, i: int) -> None:
        """Send micro-batch ``i``'s output to stage s + 1 (after the step's flag, ahead of
        the step's first activation, and its header when shapes changed); post the receive
        of its gradient, which has the output's shape and dtype."""
        t = output.contiguous()
        self._flag_arrived(block=True)  # read already: a later stage receives before it sends
        if self._flag_owed:
            flag = torch.tensor([int(self.headers)], dtype=torch.int64, device=self.device)
            self._isend(flag, self.next_rank, self._tag(-1, FLAG, 1))
            self._flag_owed = False
        if self.headers:
            self._isend(shape_header(t, self.device), self.next_rank, self._tag(i, HEADER, 1))
        self._isend(t, self.next_rank, self._tag(i, ACT, 1))
        self._post(GRAD, i, t.shape, t.dtype)

    def recv_forward(self, i: int) -> torch.Tensor:
        """Micro-batch ``i``'s input from stage s - 1: its prefetched receive, or one posted
        now (after reading its header when shapes changed this step)."""
        if (ACT, i) not in self._recvs:
            self._flag_arrived(block=True)
            if self.headers:
                h = self._empty(2 + _MAX_DIMS, torch.int64)
                self.comm.strategy.recv(h, self.prev_rank, self._tag(i, HEADER, 0))
                self._shapes[i] = read_header(h)
            elif i not in self._shapes:
                raise RuntimeError(f"stage {self.stage_index}: no shape known for micro-batch "
                                   f"{i}; every stage must start its schedule together")
            self._post(ACT, i, *self._shapes[i])
        return self._wait(ACT, i)

    def prefetch_forward(self, i: int) -> None:
        """Post the receive of micro-batch ``i``'s activation now, if its shape is known
        without a header, so that it can arrive while this stage computes."""
        if not self.is_first and (ACT, i) not in self._recvs and i in self._shapes \
                and self._flag_arrived(block=False) and not self.headers:
            self._post(ACT, i, *self._shapes[i])

    # -- backward: gradients ----------------------------------------------------------------
    def send_backward(self, input_grad: torch.Tensor, i: int) -> None:
        """Send the gradient of micro-batch ``i``'s input to stage s - 1."""
        self._isend(input_grad.contiguous(), self.prev_rank, self._tag(i, GRAD, -1))

    def recv_backward(self, i: int) -> torch.Tensor:
        """The gradient of micro-batch ``i``'s output, from stage s + 1 (posted when the
        output was sent)."""
        if (GRAD, i) not in self._recvs:
            raise RuntimeError(f"stage {self.stage_index}: no gradient receive posted for "
                               f"micro-batch {i}; send_forward its output first")
        return self._wait(GRAD, i)

    def wait_sends(self) -> None:
        """Wait for this step's sends (the end of the step)."""
        for req in self._sends:
            req.wait()
        self._sends.clear()

    # -- plumbing ---------------------------------------------------------------------------
    def _tag(self, i: int, kind: int, dest_offset: int) -> int:
        return tag(i, kind, self.stage_index + dest_offset, self.num_stages)

    def _empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _isend(self, t: torch.Tensor, peer: int, message_tag: int) -> None:
        self._sends.append(self.comm.strategy.isend(t, peer, message_tag))

    def _post(self, kind: int, i: int, shape, dtype: torch.dtype) -> None:
        peer = self.prev_rank if kind == ACT else self.next_rank
        buf = self._empty(shape, dtype)
        self._recvs[(kind, i)] = (self.comm.strategy.irecv(buf, peer, self._tag(i, kind, 0)), buf)

    def _wait(self, kind: int, i: int) -> torch.Tensor:
        req, buf = self._recvs.pop((kind, i))
        req.wait()
        return buf
