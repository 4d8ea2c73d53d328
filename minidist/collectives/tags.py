"""The tags the collectives talk on, and how a tensor is cut into chunks.

Collectives talk through the Communicator's public channel for them, ``comm.collective``:
point-to-point on a context of the communicator's own, so a user's message, whatever its
tag, never matches a collective's receive (nor the reverse), and every payload byte shows up
in ``comm.stats``. Each collective has its own tag there. Calls on one communicator happen
in the same order on every rank, and messages between two ranks on one tag arrive in order,
so one tag per collective is enough.
"""

from __future__ import annotations

import torch

from .. import checks
from ..comm import tensors

TAG = {"broadcast": -20, "reduce": -21, "gather": -22, "scatter": -23, "all_gather": -24,
       "reduce_scatter": -25, "all_to_all": -26, "naive": -30, "tree": -31, "ring": -32,
       "recursive_doubling": -33, "halving_doubling": -34}


def chunk_bounds(n: int, k: int) -> list[int]:
    """Offsets of ``k`` nearly equal chunks of ``n`` items, the first ``n % k`` one larger
    (``torch.tensor_split``'s rule): chunk i is ``[b[i], b[i + 1])``."""
    q, r = divmod(n, k)
    return [i * q + min(i, r) for i in range(k + 1)]


def as_flat(t, what: str) -> torch.Tensor:
    """``t`` (tensor or numpy array) as a 1-D tensor that shares its memory."""
    return tensors.as_tensor(t, what).reshape(-1)


def check_root(root, comm, what: str) -> int:
    return checks.rank(root, comm.world_size, what)
