"""The channels of a Communicator (``communicator.py``): named contexts, and tag arithmetic.

Every message header carries a context id, ``ctx``. A communicator owns ``SLOTS``
consecutive ids from its ``base`` (a multiple of ``SLOTS``), one per channel:

========== ===================================================== ========= ===============
channel    what travels on it                                    counted   ``comm.`` name
========== ===================================================== ========= ===============
USER       the user's ``send``/``recv``                          yes       (the methods)
CONTROL    barrier, split, the collectives' agreement checks      no        ``control``
COLLECTIVE the collectives' payload                               yes       ``collective``
ACK        acknowledgements of sends above the eager limit        no        (internal)
STRATEGY   the strategies' point-to-point payload (the parameter  yes       ``strategy``
           server's pushes and pulls, the pipeline's activations
           and gradients)
CHECK      the agreement checks (collectives, DDP, the sampler:   no        ``channel(Ch.
           did every rank pass the same arguments?); free on                CHECK)``
           virtual time: NCCL and gloo make no such check
========== ===================================================== ========= ===============

So no message of one channel can match a receive of another, whatever its tag; a
split-off communicator's ``base`` is a hash every member computes alike, so no message of
one communicator can match a receive of another. ``channel_of(ctx)`` names the channel of
any id (the grader's sandbox and the torch transport read it).
"""

from __future__ import annotations

import enum
import hashlib

import torch

from .. import checks
from . import tensors


class Ch(enum.IntEnum):
    """A channel: its offset from the communicator's base context (module docstring)."""

    USER = 0
    CONTROL = 1
    COLLECTIVE = 2
    ACK = 3
    STRATEGY = 4
    CHECK = 5


ANY_SOURCE = -1  # a receive from whoever sends first
SLOTS = 8  # context ids per communicator (a power of two: the channel is ctx % SLOTS)
WORLD_CTX = SLOTS  # the base of the communicator md.launch / md.init returns
PAYLOAD = (Ch.USER, Ch.COLLECTIVE, Ch.STRATEGY)  # the counted channels, acknowledged above
# the eager limit; an acknowledgement's tag says which of them its message was on


def channel_of(ctx: int) -> Ch:
    return Ch(ctx % SLOTS)


def base_of(ctx: int) -> int:
    """The base context of the communicator that ``ctx`` belongs to."""
    return ctx - ctx % SLOTS


ACK = torch.empty(0, dtype=torch.uint8)  # an acknowledgement carries no payload
ACK_CODE = tensors.DTYPE_CODE[torch.uint8]


def ack_tag(channel: Ch, tag: int) -> int:
    """The acknowledgement's tag on the ACK channel: the message's tag and which payload
    channel it was on, so acknowledgements of two channels never match each other."""
    return len(PAYLOAD) * tag + PAYLOAD.index(channel)


TAG_LIMIT = 2**61  # an acknowledgement's tag, 3 tag + 2, must fit the header's int64


def check_tag(tag) -> None:
    checks.integer(tag, "tag", low=None, error=TypeError)
    if not -TAG_LIMIT <= int(tag) < TAG_LIMIT:
        raise ValueError(f"tag {tag} is out of range")


def child_ctx(parent: int, n: int, color: int) -> int:
    """A base context every member computes alike: a hash of (parent, split count, color)."""
    digest = hashlib.blake2b(f"{parent}/{n}/{color}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 4) << 3  # a multiple of SLOTS, < 2**63
