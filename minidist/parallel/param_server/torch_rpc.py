"""The real system to compare with: PyTorch's RPC parameter server, as in its tutorial
"Implementing Batch RPC Processing Using Asynchronous Executions" (Shen Li; the
synchronous, batch-updating parameter server of ``pytorch/examples/distributed/rpc/batch``).

Rank 0 holds a ``BatchUpdateParameterServer`` behind an ``RRef``; every trainer calls
``update_and_fetch_model`` with ``rpc_sync`` and its gradients. The call is
``@rpc.functions.async_execution``: it returns a future that completes once all W
trainers' gradients are in and the optimizer has stepped, so the reply carries the new
parameters: a push and a pull in one round trip, over TensorPipe (TCP here). One difference
from the tutorial: it returns the parameter tensors, not the whole module (which pickles
the same tensors plus the module object).

Run it under ``md.launch`` (each rank calls ``init_rpc`` on a free port of its own)::

    md.launch(torch_rpc.run, workers + 1, args=(free_port(), make_model, trainer))

``trainer(client, rank)`` runs on ranks 1..W; rank 0 returns their results.
"""

from __future__ import annotations

import socket
import threading
import warnings

import torch
import torch.distributed.rpc as rpc


class BatchUpdateParameterServer:
    """Gradients accumulate under a lock; the W-th one averages them, steps the optimizer
    and completes the future every trainer waits on."""

    def __init__(self, model: torch.nn.Module, workers: int, lr: float):
        self.model, self.workers, self.count = model, workers, 0
        self.lock = threading.Lock()
        self.future = torch.futures.Future()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def params(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.model.parameters()]

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        with self.lock:
            self.count += 1
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            future = self.future
            if self.count >= self.workers:
                for p in self.model.parameters():
                    p.grad /= self.workers
                self.count = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                future.set_result(self.params())
                self.future = torch.futures.Future()
        return future


def _params(ps_rref) -> list[torch.Tensor]:
    return ps_rref.local_value().params()


class RpcClient:
    """A trainer's handle: ``fetch()`` the parameters into ``model``, and
    ``update_and_fetch()``: send ``p.grad`` of every parameter, get the new ones back."""

    def __init__(self, ps_rref, model: torch.nn.Module):
        self.ps_rref, self.model = ps_rref, model

    def _load(self, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self.model.parameters(), values):
                p.copy_(v)

    def fetch(self) -> None:
        self._load(rpc.rpc_sync(self.ps_rref.owner(), _params, args=(self.ps_rref,)))

    def update_and_fetch(self) -> None:
        grads = [p.grad for p in self.model.parameters()]
        self._load(rpc.rpc_sync(self.ps_rref.owner(),
                                BatchUpdateParameterServer.update_and_fetch_model,
                                args=(self.ps_rref, grads)))


def _trainer(ps_rref, make_model, trainer, rank: int):
    client = RpcClient(ps_rref, make_model())
    client.fetch()
    return trainer(client, rank)


def run(comm, port: int, make_model, trainer, lr: float = 1e-3) -> list | None:
    """Every rank of an ``md.launch``: join the RPC world on ``port``; rank 0 hosts the
    server (``make_model()``) and returns ``trainer(client, rank)`` of ranks 1..W."""
    warnings.filterwarnings("ignore", message="You are using a Backend")  # torch's own
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                           num_worker_threads=8, rpc_timeout=120)
    name = "ps" if comm.rank == 0 else f"trainer{comm.rank}"
    rpc.init_rpc(name, rank=comm.rank, world_size=comm.world_size, rpc_backend_options=opts)
    out = None
    if comm.rank == 0:
        server = BatchUpdateParameterServer(make_model(), comm.world_size - 1, lr)
        ps_rref = rpc.RRef(server)
        futures = [rpc.rpc_async(f"trainer{r}", _trainer, args=(ps_rref, make_model, trainer, r))
                   for r in range(1, comm.world_size)]
        out = [f.wait() for f in futures]
    rpc.shutdown()
    return out


def free_port() -> int:
    """A TCP port nothing listens on now (for ``run``'s rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
