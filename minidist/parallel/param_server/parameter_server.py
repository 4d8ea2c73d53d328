"""``md.ParameterServer``: one object, two roles. Ranks ``0..num_servers-1`` serve, the
others work; the object checks the arguments, agrees on them with every rank, and hands the
work to a ``ShardServer`` (``server.py``) or a ``WorkerClient`` (``worker.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from ...checks import integer, one_of, positive_int
from ...collectives import broadcast
from .reports import ServerReport, WorkerReport
from .server import ShardServer
from .sharding import DEFAULT_SLICE_THRESHOLD, ShardPlan, plan_shards
from .shared_shards import open_shared_shards
from .worker import WorkerClient

MODES = ("sync", "async", "ssp")
ON_WORKER_EXIT = ("error", "continue")


class ParameterServer:
    """A sharded parameter server (Li et al., OSDI 2014) with three consistency models.

    ``ps = md.ParameterServer(comm, model, num_servers=1, mode="sync", staleness=0,
    optimizer_class=torch.optim.SGD, **optimizer_kwargs)`` on every rank (it is collective:
    the ranks check that they agree on the arguments and the model, and start from rank 0's
    parameters). Ranks ``0..num_servers-1`` are servers (``ps.is_server``): they call
    ``ps.serve()``, which returns once every worker has called ``close()`` (or has left).
    The other ``W = world_size - num_servers`` ranks are workers: ``ps.pull()`` copies the
    current parameters into ``model``; after ``loss.backward()``, ``ps.push()`` sends
    ``p.grad`` of every parameter (or ``push(grads)`` an explicit list); ``ps.close()``
    says goodbye. The servers run ``optimizer_class(shard, **optimizer_kwargs)`` on the
    parameters they own, so any torch optimizer works (an element-wise one, SGD, momentum,
    Adam, gives exactly the single-process result; one that uses a whole tensor's norm
    sees a sliced tensor's pieces separately).

    Sharding (``sharding.py``): tensors above ``slice_threshold`` elements are sliced evenly
    across all servers (MXNet kvstore's "big array" rule); smaller ones go whole to the
    least-loaded server (largest first), so each server holds about N/S of the N parameter
    bytes and receives W*N/S bytes per synchronous step. ``num_servers=1`` is the naive
    version: one server holds everything and receives W*N bytes per step (``costmodel/ps.py``).

    Modes (``mode``):

    * ``"sync"``: the servers apply one update per step, the average of all W workers'
      gradients, and answer a worker's pull only once its last push has been applied: the
      trajectory of one process on the full batch (DistBelief's sandblaster, TF's
      ``ParameterServerStrategy`` with synchronous workers).
    * ``"async"``: every push is applied at once (Downpour SGD; Hogwild! without shared
      memory); a pull returns whatever is current. The staleness of an update is how many
      updates the server applied between the worker's pull and its push.
    * ``"ssp"``: stale synchronous parallel (Ho et al., NIPS 2013): pushes are applied at
      once, but a worker that has pushed c times is admitted to pull only while
      ``c - (slowest active worker's pushes) <= staleness``; it never runs more than
      ``staleness`` steps ahead. ``staleness=0`` is lock-step with per-worker updates.

    async and ssp apply each worker's gradient with the full learning rate, W updates per
    round of pushes, as Downpour SGD does; sync applies one average per round.

    Membership: a worker may ``close()`` early, or die (return without closing), and in
    async and ssp the servers log it, record it in ``report().departed`` (and its last step
    heard in ``departed_step``) and carry on with the others; ssp's bound then counts only
    the workers that remain. In sync, a departure that leaves a step without a worker's
    gradient raises ``WorkerLeftError`` naming the worker, unless
    ``on_worker_exit="continue"``, which averages over the workers that remain. A worker
    that starts late gets the current parameters at its first pull (async: at once; sync
    and ssp wait for it, as they must).

    A worker process that dies for real (SIGKILL, ``os._exit``, an uncaught exception)
    stops the whole launch by default, as mpirun and torchrun do. Launch with
    ``md.launch(train, n, on_rank_failure="continue")`` and the launcher tells the servers
    instead (their receives from the dead worker fail at once): the departure above, while
    launch returns the survivors' results with an ``md.RankFailed`` in the dead worker's
    slot (``launch/failures.py``). A failure the others cannot do without (a server; a sync
    step short of the dead worker) still raises, naming the rank that died.

    Shared memory (``shared_memory``): when every rank is on one machine (the local
    backend, no emulated network), sync mode keeps each server's shard and a gradient slot
    per worker in shared memory (``shared_shards.py``): a push is one copy into the slot and
    a header, a pull a reply and one copy out, no message carries the bytes (they are
    counted as if one did). ``None`` (the default) uses it where it can; ``False`` always
    sends messages (the naive version, and what a cluster does); ``True`` requires it.
    ``ps.shared_memory`` says which path this object took.

    Statistics: ``ps.report()`` (``reports.py``): on a server, the staleness of every applied
    update, updates applied, payload bytes in and out, pulls served, departures with their
    reason; on a worker, steps, seconds waiting in pull and push, the staleness its pushes
    had. ``comm.timeline`` (when enabled) shows "ps.push", "ps.pull" and "ps.update" spans.
    ``ps.plan`` (a ``ShardPlan``) says which server owns what. Stragglers: a worker sleeps
    at ``"forward"`` (the end of ``pull``) and ``"step"`` (the start of ``push``) under
    ``md.slow_rank`` / ``md.inject_delay``.

    ``comm`` must be used by the parameter server alone while it runs (its messages travel
    on the communicator's control and collective channels, with tags of their own).
    Death detection relies on ``md.PeerLeftError``, which the local backend provides (a
    killed worker only under ``on_rank_failure="continue"``, which marks it in the shared
    segment); on the torch backend a worker that returns without closing ends in a
    ``CommTimeout``, and launch refuses ``on_rank_failure="continue"`` (a process group
    cannot go on without a member). The real system to compare with, PyTorch's RPC
    parameter server, is in ``torch_rpc.py``.
    """

    def __init__(self, comm, model: nn.Module, num_servers: int = 1, mode: str = "sync",
                 staleness: int = 0, optimizer_class=torch.optim.SGD,
                 on_worker_exit: str = "error", slice_threshold: int | None =
                 DEFAULT_SLICE_THRESHOLD, shared_memory: bool | None = None,
                 **optimizer_kwargs):
        _check_args(comm, model, num_servers, mode, staleness, optimizer_class,
                    on_worker_exit, slice_threshold)
        _check_shared_memory(shared_memory, mode)
        _check_optimizer(optimizer_class, optimizer_kwargs)
        self.comm, self.model, self.mode = comm, model, mode
        self.num_servers, self.staleness = num_servers, staleness
        named = list(model.named_parameters())
        self.params = [p for _, p in named]
        use_shared = shared_memory is not False and mode == "sync"
        _agree(comm, self.params, num_servers, mode, staleness, use_shared)
        self.plan: ShardPlan = plan_shards([tuple(p.shape) for p in self.params],
                                           num_servers, slice_threshold)
        workers = list(range(num_servers, comm.world_size))
        shared = open_shared_shards(comm, self.plan, workers, self.params[0].dtype,
                                    required=bool(shared_memory)) if use_shared else None
        self.shared_memory = shared is not None
        if self.is_server:
            self._role: ShardServer | WorkerClient = ShardServer(
                comm, self.params, self.plan, workers, mode, staleness, optimizer_class,
                optimizer_kwargs, on_worker_exit, shared and shared[comm.rank])
        else:
            self._role = WorkerClient(comm, named, self.plan, mode, shared)

    # -- roles ------------------------------------------------------------------------------
    @property
    def is_server(self) -> bool:
        """True on ranks ``0..num_servers-1``."""
        return self.comm.rank < self.num_servers

    @property
    def num_workers(self) -> int:
        return self.comm.world_size - self.num_servers

    def serve(self) -> ServerReport:
        """Server ranks: answer pulls and apply pushes until every worker has closed or left;
        returns (and keeps) the report. On a server, the local ``model`` then holds this
        server's shard of the final parameters (the rest of it is stale)."""
        return self._server("serve").serve()

    def pull(self) -> int:
        """Worker ranks: copy the servers' current parameters into the model (blocking as
        the mode requires); returns the version pulled (updates applied on server 0)."""
        return self._worker("pull").pull()

    def push(self, grads: list[torch.Tensor] | None = None) -> None:
        """Worker ranks: send the gradients (``p.grad`` of every parameter, or ``grads`` in
        ``model.parameters()`` order), each server its shard. Returns once sent; it does
        not wait for the update (a pull does, in sync mode)."""
        self._worker("push").push(grads)

    def close(self) -> None:
        """Worker ranks: tell every server this worker is done; the servers carry on with the
        others. Call it once, after the last push."""
        self._worker("close").close()

    def report(self) -> ServerReport | WorkerReport:
        """This rank's statistics so far (``reports.py``)."""
        return self._role.report()

    def _server(self, what: str) -> ShardServer:
        if not isinstance(self._role, ShardServer):
            raise RuntimeError(f"rank {self.comm.rank} is a worker (ranks 0..{self.num_servers - 1}"
                               f" are the servers): call pull/push/close, not {what}()")
        return self._role

    def _worker(self, what: str) -> WorkerClient:
        if not isinstance(self._role, WorkerClient):
            raise RuntimeError(f"rank {self.comm.rank} is a server (ranks 0..{self.num_servers - 1}"
                               f"): call serve(), not {what}()")
        return self._role

    def __repr__(self) -> str:
        role = "server" if self.is_server else "worker"
        return (f"ParameterServer(rank={self.comm.rank} {role}, num_servers={self.num_servers}, "
                f"workers={self.num_workers}, mode={self.mode!r}, staleness={self.staleness})")


def _check_args(comm, model, num_servers, mode, staleness, optimizer_class, on_worker_exit,
                slice_threshold) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    positive_int(num_servers, "num_servers")
    if num_servers >= comm.world_size:
        raise ValueError(f"num_servers={num_servers} leaves no worker: world_size is "
                         f"{comm.world_size}, and ranks 0..num_servers-1 are servers, so "
                         f"num_servers must be at most {comm.world_size - 1}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(map(repr, MODES))}")
    integer(staleness, "staleness (steps a worker may run ahead of the slowest)", low=0)
    if staleness and mode != "ssp":
        raise ValueError(f"staleness={staleness} only means something with mode='ssp', "
                         f"not mode={mode!r}")
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class,
                                                              torch.optim.Optimizer)):
        raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got "
                        f"{optimizer_class!r}")
    one_of(on_worker_exit, ON_WORKER_EXIT, "on_worker_exit")
    if slice_threshold is not None:
        positive_int(slice_threshold, "slice_threshold (elements, or None)")
    params = list(model.parameters())
    if not params:
        raise ValueError("model has no parameters: a parameter server has nothing to serve")
    dtypes = sorted({str(p.dtype) for p in params})
    if len(dtypes) > 1:
        raise ValueError(f"ParameterServer needs every parameter in one dtype (the shards "
                         f"travel as flat buffers), but the model has {', '.join(dtypes)}")


def _check_shared_memory(shared_memory, mode: str) -> None:
    if shared_memory not in (None, True, False):
        raise TypeError(f"shared_memory must be None (when the ranks can), True or False, "
                        f"got {shared_memory!r}")
    if shared_memory and mode != "sync":
        raise ValueError(f"shared_memory=True needs mode='sync': in mode {mode!r} the server "
                         "applies a push while other workers read the shard, so the shards "
                         "travel as messages (shared_shards.py)")


def _check_optimizer(optimizer_class, optimizer_kwargs: dict) -> None:
    """Build the optimizer on a dummy tensor, so that bad keyword arguments fail on every
    rank, workers included, not only on the servers."""
    try:
        optimizer_class([torch.zeros(1, requires_grad=True)], **optimizer_kwargs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"optimizer_class={optimizer_class.__name__} rejects the optimizer "
                      f"arguments {optimizer_kwargs}: {e}") from e


_MODE_CODE = {m: i for i, m in enumerate(MODES)}


def _agree(comm, params: list[torch.Tensor], num_servers: int, mode: str,
           staleness: int, shared: bool) -> None:
    """Every rank must pass the same arguments and a model of the same shapes; then all
    start from rank 0's parameters (a broadcast), as DDP does."""
    mine = [num_servers, _MODE_CODE[mode], staleness, len(params),
            sum(p.numel() for p in params), int(shared)]
    table = comm.control.all_gather_ints(mine, op="ParameterServer agreement")
    names = ("num_servers", "mode", "staleness", "number of parameter tensors",
             "number of parameter elements", "shared_memory allowed (not False)")
    for r, row in enumerate(table):
        for name, a, b in zip(names, table[0], row):
            if a != b:
                show = (lambda v: MODES[v]) if name == "mode" else (lambda v: v)
                raise ValueError(f"ParameterServer needs the same arguments and model on every "
                                 f"rank, but {name} is {show(a)!r} on rank 0 and {show(b)!r} "
                                 f"on rank {r}")
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        broadcast(comm, flat, src=0)
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            p.copy_(piece.view_as(p))
