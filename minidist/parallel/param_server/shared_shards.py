"""On one machine the wire can be skipped: each server's shard, and a gradient slot per
worker, in shared memory (sync mode).

Through the local transport's rings (``transports/local.py``), a push of N bytes is copied
twice (the worker into the ring, the server out of it) and needs both processes on a core
at the same moment; each pull again. When every rank is on one machine, a server can
instead keep its shard where the workers can read it, and give each worker a slot to
write its gradient into:

    server s's buffer:  [ shard (the parameters) | slot of worker 0 | ... | slot of W-1 ]

A push is one copy (the gradient's pieces into the worker's slot) and a small header on
the control channel; the server averages straight out of the slots (``rules.average``)
and steps the optimizer on the shard in place; a pull is a small reply and one copy (the
shard into the model). This is what NCCL does between GPUs of one node (its SHM and P2P
transports put the buffers where both sides can reach them) and what ps-lite's zero-copy
``SArray`` aims at; the message path stays for the torch backend, the emulated network
(whose point is the wire) and the async and ssp modes.

Why nobody reads what is being written, in sync mode:

* the server changes the shard only when a step completes, which needs every active
  worker's next push; a worker pushes only after it has copied the shard of its last pull
  (``WorkerClient`` completes a pending pull before it writes its slot again);
* a worker writes its slot only after a reply to a pull asked after its last push, which
  the server sends only once that push has been applied, so the server is done with it.

async and ssp apply a push while other workers read the shard: they use messages.

Bytes are counted as the messages they replace (``comm.stats``, the reports), as the
shared-memory all_reduce does, so ``W*N/S`` into each server holds on both paths.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("minidist")
ALIGN = 64  # bytes: each region starts on its own cache line


class SharedShard:
    """Server ``server``'s buffer mapped in this process: ``params`` (the shard) and
    ``slots[w]`` (worker ``w``'s gradient), flat tensors of ``numel`` elements."""

    def __init__(self, buf, server: int, numel: int, dtype: torch.dtype, workers: list[int]):
        self.buf, self.server, self.numel = buf, server, numel
        stride = region_bytes(numel, dtype)
        self.params = buf.tensor(0, numel, dtype)
        self.slots = {w: buf.tensor(stride * (i + 1), numel, dtype)
                      for i, w in enumerate(workers)}

    def close(self) -> None:
        """Drop the views and unmap (the memory goes once every rank has done so)."""
        self.params, self.slots = None, {}
        self.buf.close()


def region_bytes(numel: int, dtype: torch.dtype) -> int:
    n = numel * torch.empty(0, dtype=dtype).element_size()
    return (n + ALIGN - 1) // ALIGN * ALIGN


def open_shared_shards(comm, plan, workers: list[int], dtype: torch.dtype,
                       required: bool) -> dict[int, SharedShard] | None:
    """Collective over ``comm``: every server makes its buffer, every worker maps them all.
    Returns ``{server: SharedShard}`` (a server gets its own, a worker all of them), or
    None on every rank when one of them cannot (no ``"shared_memory"`` capability, or
    /dev/shm refuses): then the ranks talk in messages, or, if ``required``, all raise."""
    make = comm.capability("shared_memory")
    S, me = plan.num_servers, comm.rank
    buf, key, why = None, (0, 0), ""
    if make is not None and me < S:
        try:
            buf = make.create((len(workers) + 1) * region_bytes(plan.numel(me), dtype))
            key = buf.key
        except (OSError, MemoryError) as e:
            why = str(e)
    table = comm.control.all_gather_ints([int(make is not None), *key],
                                         op="ParameterServer shared memory")
    failed = next((r for r, row in enumerate(table) if not row[0]), None)
    if failed is None:
        failed = next((s for s in range(S) if table[s][1:] == [0, 0]), None)
    mapped = _attach_all(make, table, S) if failed is None and me >= S else {}
    oks = comm.control.all_gather_ints([int(mapped is not None)],
                                       op="ParameterServer shared memory")
    if buf is not None:
        buf.unlink()  # every rank that could attach has: the name may go
    if failed is None:
        failed = next((r for r, (ok,) in enumerate(oks) if not ok), None)
    if failed is not None:
        return _give_up(buf, mapped, failed, why, required, me)
    if me < S:
        mapped = {me: buf}
    return {s: SharedShard(b, s, plan.numel(s), dtype, workers) for s, b in mapped.items()}


def _attach_all(make, table: list[list[int]], servers: int) -> dict | None:
    mapped = {}
    try:
        for s in range(servers):
            mapped[s] = make.attach(make.name_of(table[s][1:]))
    except OSError as e:
        log.warning("parameter server: cannot map server %d's shared memory (%s)", s, e)
        for b in mapped.values():
            b.close()
        return None
    return mapped


def _give_up(buf, mapped, failed: int, why: str, required: bool, me: int) -> None:
    for b in [buf, *(mapped or {}).values()]:
        if b is not None:
            b.close()
    if required:
        raise RuntimeError(f"rank {me}: ParameterServer(shared_memory=True), but rank "
                           f"{failed} cannot share memory with the others (a backend "
                           f"without the 'shared_memory' capability, e.g. torch or the "
                           f"emulated network, or /dev/shm is full){': ' + why if why else ''}")
    return None
