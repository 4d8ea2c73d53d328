"""minidist's comm hooks under torch's own DDP: ``torch_hook(hook)``.

torch's ``DistributedDataParallel.register_comm_hook(state, hook)`` calls
``hook(state, bucket) -> torch.futures.Future`` with a ``GradBucket`` (``buffer()``,
``index()``, ``gradients()``, ``parameters()``: methods). minidist's hooks take
``hook(comm, bucket) -> tensor`` with a ``Bucket`` whose ``buffer``, ``index`` and ``views``
are attributes. ``torch_hook`` adapts one to the other, so the same ``TopK`` or ``PowerSGD``
object runs under minidist DDP and under torch DDP, and a benchmark can tell the hook's cost
from the DDP around it::

    comm = md.init()                                      # torchrun, or md.launch(backend="torch")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(comm, md.compression.torch_hook(md.compression.PowerSGD(rank=2)))

The hook's collectives go through ``comm`` (on the world communicator of the torch backend,
``auto`` is ``torch.distributed.all_reduce`` itself). torch rebuilds its buckets after the
first step (by the order gradients arrived), so per-bucket state keyed by ``index`` (error
feedback, warm-start Q's) should start after it: torch's own ``powerSGD_hook`` requires
``start_powerSGD_iter > 1`` for the same reason; ``PowerSGD(start_iter=2)`` or more. The
hook runs synchronously; the returned future is already complete.
"""

from collections.abc import Callable

import torch


class TorchBucket:
    """A torch ``GradBucket`` seen as a minidist ``Bucket``: ``buffer``, ``index``,
    ``views`` (the gradients, views of the buffer shaped like their parameters),
    ``grads`` and ``params``."""

    def __init__(self, bucket):
        self.buffer = bucket.buffer()
        self.index = bucket.index()
        self.params = list(bucket.parameters())
        sizes = [p.numel() for p in self.params]
        self.views = [chunk.view_as(p) for chunk, p in zip(self.buffer.split(sizes),
                                                           self.params)]
        self.grads = self.views

    def __repr__(self) -> str:
        return (f"TorchBucket({self.index}, {len(self.params)} params, "
                f"{self.buffer.numel()} elements)")


def torch_hook(hook: Callable) -> Callable:
    """``hook(comm, bucket) -> tensor`` as torch DDP's ``hook(state, GradBucket) -> Future``;
    register it with ``ddp.register_comm_hook(comm, torch_hook(hook))``."""
    if not callable(hook):
        raise TypeError(f"torch_hook needs a minidist comm hook (a callable), got "
                        f"{type(hook).__name__}")

    def run(comm, bucket) -> torch.futures.Future[torch.Tensor]:  # torch checks this
        view = TorchBucket(bucket)
        out = hook(comm, view)
        if out is not view.buffer:
            view.buffer.copy_(out)
        future = torch.futures.Future()
        future.set_result(view.buffer)
        return future

    run.__name__ = run.__qualname__ = f"torch_hook({getattr(hook, '__name__', 'hook')})"
    return run
