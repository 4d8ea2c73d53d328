"""Every rank skips the same steps: found_inf all-reduced (max) over the ranks that must agree.

Which ranks must agree: all that take part in one optimizer step. After DDP's all-reduce the
gradients are bitwise equal on every data-parallel rank, so their local checks agree without
a message; ranks that hold *different* gradients do not: ZeRO shards (each checks its own
slice), tensor-parallel slices, pipeline stages. If one of them overflows and skips while
the others step, their loss scales part ways and the replicas never meet again
(``tests/parallel/amp/test_grad_scaler.py`` shows it). DeepSpeed and Megatron-LM all-reduce
the overflow flag over the model-parallel group for this reason; a ``DeviceMesh`` gives every
dimension's group here, and a max over each dimension in turn is a max over the whole mesh.

bfloat16 needs no loss scale (float32's range: overflow is rare) but the same agreement: a
NaN (a bad sample, a log of 0) is a NaN in any format. A rank that skips while the others
step (or steps on it while they skip) parts the replicas; without any check the NaN reaches
every rank through the next all-reduce. ``GradScaler(comm, loss_scaling=False)``
agrees on it without scaling (``tests/parallel/amp/test_bf16_agreement.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...collectives import all_reduce
from ..mesh import DeviceMesh


def agree_found_inf(comms: Sequence, found: bool) -> bool:
    """``found`` on any rank of any of ``comms`` -> True on all of them: one all_reduce
    (max) of a float32 flag per communicator, in order. Collective on every communicator."""
    if not comms:
        return found
    # on the communicators' device: NCCL reduces CUDA tensors only (a mesh's groups share one)
    flag = torch.tensor([1.0 if found else 0.0], device=comms[0].device)
    for comm in comms:
        all_reduce(comm, flag, op="max")
    return bool(flag.item())


def agreement_cost(group_sizes: Sequence[int], alpha: float, beta: float,
                   flag_bytes: int = 4) -> float:
    """Seconds per step to agree on found_inf: one all_reduce (max) of a ``flag_bytes`` flag
    per communicator, latency-bound, so recursive doubling's ceil(lg p) rounds of
    alpha + flag_bytes * beta each (``collectives/allreduce.py``)."""
    return sum(math.ceil(math.log2(p)) * (alpha + flag_bytes * beta) for p in group_sizes
               if p > 1)


def communicators(comm) -> list:
    """``comm`` as a list of communicators: None -> [], a DeviceMesh -> one per dimension."""
    if comm is None:
        return []
    if isinstance(comm, DeviceMesh):
        return [comm[name] for name in comm.names if comm.size(name) > 1]
    if isinstance(comm, Sequence) and not isinstance(comm, (str, bytes)):
        comms = list(comm)
    else:
        comms = [comm]
    for c in comms:
        if not (hasattr(c, "world_size") and hasattr(c, "rank")):
            raise TypeError("comm must be a communicator, a list of communicators or a "
                            f"DeviceMesh, got {type(c).__name__}")
    return [c for c in comms if c.world_size > 1]
