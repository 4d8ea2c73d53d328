"""The messages between workers and servers: a small header on the uncounted control channel
(what the worker wants), then the payload on the counted collective channel (the shard).

A worker's header is three int64s ``[kind, a, b]``:

* ``[PULL, clock, 0]``: send me your shard of the parameters (when the mode allows);
* ``[PUSH, version, numel]``: a gradient of ``numel`` elements follows on tag ``PUSH``,
  computed on the parameters of ``version`` (how many updates the server had applied);
* ``[CLOSE, clock, 0]``: this worker is done.

The server answers a pull with ``[version, staleness]`` (the staleness of this worker's last
applied push, -1 before any) and the flat shard on tag ``PARAMS``. At ``close()`` a worker
also sends an empty message on tag ``BYE``: each server keeps a receive from every worker
posted there, and when that receive fails with ``md.PeerLeftError`` the worker has returned
without closing, which is how a server notices a death (local backend; a killed worker
under ``md.launch(..., on_rank_failure="continue")``, whose launcher marks it dead).

Messages between two ranks on one tag arrive in order, so a payload always follows its
header, and a worker's pushes, pulls and close reach a server in the order it sent them.
The tags sit far above anything the collectives or the communicator use.
"""

from __future__ import annotations

import torch

PULL, PUSH, CLOSE = 1, 2, 3
KINDS = {PULL: "pull", PUSH: "push", CLOSE: "close"}
_BASE = 1 << 44
HEADER, REPLY, BYE = _BASE + 1, _BASE + 2, _BASE + 3  # control channel
GRADS, PARAMS = _BASE + 4, _BASE + 5  # collective channel (counted)
EMPTY = torch.empty(0, dtype=torch.uint8)


def header(kind: int, a: int = 0, b: int = 0) -> torch.Tensor:
    return torch.tensor([kind, a, b], dtype=torch.int64)


def header_buffer() -> torch.Tensor:
    return torch.empty(3, dtype=torch.int64)


def reply(version: int, staleness: int) -> torch.Tensor:
    return torch.tensor([version, staleness], dtype=torch.int64)


def reply_buffer() -> torch.Tensor:
    return torch.empty(2, dtype=torch.int64)
