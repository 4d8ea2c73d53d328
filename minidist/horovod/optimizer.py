"""``hvd.DistributedOptimizer``: the wrapped optimizer, averaging gradients as backward
produces them.

Horovod's recipe (``horovod/torch/optimizer.py``): the result is an instance of a class
made on the fly as a subclass of the wrapped optimizer's class, so it *is* that optimizer
(``isinstance``, ``param_groups``, ``state_dict``, ``load_state_dict``, a scheduler all
work) with ``step`` and ``zero_grad`` extended. A hook on every parameter fires when
autograd has accumulated its gradient and starts an asynchronous in-place allreduce of
it (``allreduce_async_``), so communication overlaps the rest of backward; ``step()``
(or ``synchronize()``) waits for all of them, after starting the ones whose hook never
fired (an unused parameter's gradient is zeros, as in Horovod, so every rank submits the
same tensors). ``backward_passes_per_step = k`` lets gradients accumulate over k backward
passes before the allreduce (their sum, not divided by k, as Horovod's PyTorch optimizer
does). ``gradient_predivide_factor = f`` divides by f before the sum and multiplies by f
after it (so the average is unchanged, but the sum is of smaller numbers).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch

from .context import size
from .mpi_ops import Adasum, Average, Compression, Sum, allreduce_async_, op_name, synchronize


class _DistributedMixin:
    """The methods added to the wrapped optimizer's class (placed first in its MRO)."""

    def _setup(self, named, compression, passes: int, op, predivide: float) -> None:
        self._compression, self._op, self._predivide = compression, op, predivide
        self.backward_passes_per_step = passes
        self._names = {p: n for n, p in named}
        self._order = [p for group in self.param_groups for p in group["params"]
                       if p.requires_grad]
        self._delay = {p: passes for p in self._order}
        self._handles: dict = {}
        self._synchronized, self._should_synchronize = False, True
        self._hooks = []
        if size() > 1:  # as Horovod: one rank has nothing to average
            self._hooks = [p.register_post_accumulate_grad_hook(self._hook)
                           for p in self._order]

    def _hook(self, p) -> None:
        if self._delay[p] <= 0:
            raise RuntimeError(
                f"the gradient of {self._names[p]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                "step(); raise backward_passes_per_step to accumulate more passes")
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._handles[p] = self._start(p)

    def _start(self, p):
        if p.grad is None:  # a parameter this rank did not use: zeros, so the ranks agree
            p.grad = torch.zeros_like(p)
        sent, ctx = self._compression.compress(p.grad)
        pre = post = 1.0
        if self._op == Average:
            pre, post = 1.0 / self._predivide, self._predivide
        handle = allreduce_async_(sent, name=f"allreduce.{self._names[p]}", op=self._op,
                                  prescale_factor=pre, postscale_factor=post)
        return handle, ctx

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those not started yet) and write
        the averages into ``.grad``."""
        if not self._hooks:
            self._synchronized = True
            return
        for p in self._order:
            if p not in self._handles:
                self._handles[p] = self._start(p)
        for p, (handle, ctx) in self._handles.items():
            out = self._compression.decompress(synchronize(handle), ctx)
            if out.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(out)
            self._delay[p] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """``step()`` inside the block does not synchronize: for a ``synchronize()`` called
        earlier (e.g. to unscale or clip the averaged gradients first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() after optimizer.synchronize() without "
                              "optimizer.skip_synchronize(): the gradients are averaged "
                              "a second time (Horovod warns the same)", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True):
        if self._handles:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but "
                               "before optimizer.step() or optimizer.synchronize(): the "
                               "gradients being averaged would be lost")
        return super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict):
        self._handles.clear()
        self._synchronized, self._should_synchronize = False, True
        self._delay = {p: self.backward_passes_per_step for p in self._order}
        return super().load_state_dict(state_dict)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0):
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over all ranks
    (``op``: ``Average`` or ``Sum``), started as backward produces them."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if op == Adasum:
        raise NotImplementedError("op=hvd.Adasum is not implemented in minidist.horovod; "
                                  "use hvd.Average")
    if op not in (Average, Sum):
        raise ValueError(f"op must be hvd.Average or hvd.Sum, got {op_name(op)}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor applies to op=hvd.Average only")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got "
                         f"{gradient_predivide_factor}")
    if isinstance(backward_passes_per_step, bool) or \
            not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    named = _named(optimizer, named_parameters)
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedMixin, base), {})
    wrapped = cls.__new__(cls)
    torch.optim.Optimizer.__init__(wrapped, optimizer.param_groups, dict(optimizer.defaults))
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                             if k not in wrapped.__dict__})
    wrapped.state.update(optimizer.state)  # keep what the wrapped optimizer already holds
    wrapped._setup(named, compression, backward_passes_per_step, op,
                   float(gradient_predivide_factor))
    return wrapped


def _named(optimizer, named_parameters) -> list[tuple[str, torch.Tensor]]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [(f"noname.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    if any(not (isinstance(x, tuple) and len(x) == 2) for x in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, as "
                         "model.named_parameters() gives")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"named_parameters has duplicate names: {', '.join(dups)}")
    ids = {id(p) for _, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in ids]
    if unnamed:
        raise ValueError(f"named_parameters misses {len(unnamed)} of the optimizer's "
                         f"parameters (positions {unnamed[:5]} in its param_groups): "
                         "pass model.named_parameters() of the model the optimizer trains")
    return named
