"""Context and tag arithmetic of the Communicator (``communicator.py``).

A communicator owns four contexts, carried in every message header: ``ctx`` (user
messages), ``ctx + 1`` (control: barrier, split, agreement checks; not counted), ``ctx + 2``
(the collectives' payload, counted) and ``ctx + 3`` (the acknowledgements of sends above
the eager limit; not counted). A split-off communicator's ``ctx`` is a hash every member
computes alike, so no message of one communicator can match a receive of another.
"""

from __future__ import annotations

import hashlib

import torch

from . import tensors

WORLD_CTX = 4  # the communicator md.launch / md.init returns
ACK = torch.empty(0, dtype=torch.uint8)  # an acknowledgement carries no payload
ACK_CODE = tensors.DTYPE_CODE[torch.uint8]


def ack_tag(kind: int, tag: int) -> int:
    """The acknowledgement's tag on ctx + 3: the message's tag and which context it was on
    (0 user, 2 collectives), so acknowledgements of the two never match each other."""
    return 2 * tag + (kind // 2)


def check_tag(tag) -> None:
    if isinstance(tag, bool) or not hasattr(tag, "__index__"):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    if not -(2**62) <= int(tag) < 2**62:
        raise ValueError(f"tag {tag} is out of range")


def child_ctx(parent: int, n: int, color: int) -> int:
    """A context id every member computes alike: a hash of (parent, split count, color)."""
    digest = hashlib.blake2b(f"{parent}/{n}/{color}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 3) << 2  # a multiple of 4, positive, < 2**63
