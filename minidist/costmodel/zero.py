"""ZeRO's memory and communication, as code (Rajbhandari et al., SC 2020).

Memory (paper Figure 1, section 5): with Psi parameters, mixed-precision Adam holds 2 Psi
bytes of fp16 parameters, 2 Psi of fp16 gradients and K Psi of optimizer state (K = 12:
fp32 master weights, momentum, variance). Over Nd data-parallel ranks:

    stage 0: (2 + 2 + K) Psi           stage 2: 2 Psi + (2 + K) Psi / Nd
    stage 1: 4 Psi + K Psi / Nd        stage 3: (2 + 2 + K) Psi / Nd

``zero_memory`` (``md.costmodel.zero_memory``) is that table with exact quotients (7.5e9
parameters on 64 ranks: 120, 31.4, 16.6, 1.9 GB). ``zero_rank_bytes`` is what ``md.ZeRO``
actually holds: any element sizes (the tests train in float64: 8 + 8 + 16 bytes per
parameter for Adam), and each group padded to a multiple of Nd, so a rank holds
ceil(Psi / Nd) elements of a sharded part rather than Psi / Nd; the difference is under one
padding per group.

Communication per step (section 7): stages 1 and 2 reduce-scatter the gradients and
all-gather the parameters, (p - 1)/p Psi elements sent per rank each: 2 Psi in all, the
same as the all-reduce of plain data parallelism (a ring all-reduce *is* a reduce-scatter
followed by an all-gather). Stage 3 all-gathers the parameters twice (forward and
backward) and reduce-scatters once: 3 Psi, 1.5x. In alpha-beta terms each of those
collectives costs (p - 1) (alpha + Psi / p * bytes * beta) on a ring.
"""

from __future__ import annotations

from ..checks import (
    ZERO_STAGES,  # noqa: F401  (md.costmodel.ZERO_STAGES)
    positive_int,
    positive_number,
    zero_stage,
)


def zero_memory(params, dp: int, stage: int, optimizer_bytes=12, param_bytes=2,
                grad_bytes=2) -> dict[str, float]:
    """Bytes of model state per rank in mixed-precision training with ZeRO (Rajbhandari et
    al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020,
    Figure 1 and section 5).

    With Psi parameters: 2 Psi bytes of fp16 parameters, 2 Psi of fp16 gradients and
    K Psi of optimizer states (K = 12 for mixed-precision Adam: fp32 master weights,
    momentum and variance, 4 + 4 + 4 bytes). Over Nd data-parallel ranks, ZeRO shards:

    | stage | params | grads | optimizer | total |
    | --- | --- | --- | --- | --- |
    | 0 (plain data parallel) | 2 Psi | 2 Psi | K Psi | (2 + 2 + K) Psi |
    | 1 (P_os) | 2 Psi | 2 Psi | K Psi / Nd | 4 Psi + K Psi / Nd |
    | 2 (P_os+g) | 2 Psi | 2 Psi / Nd | K Psi / Nd | 2 Psi + (2 + K) Psi / Nd |
    | 3 (P_os+g+p) | 2 Psi / Nd | 2 Psi / Nd | K Psi / Nd | (2 + 2 + K) Psi / Nd |

    The paper's example, Psi = 7.5e9, Nd = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    Returns {"params", "grads", "optimizer", "total"} in bytes (exact quotients; a real
    rank pads its shard to a whole element, as ``md.ZeRO`` does). Activations, buffers and
    fragmentation are not included. ``param_bytes`` and ``grad_bytes`` (2: fp16) change the
    2s of the table: plain fp32 training is param_bytes = grad_bytes = 4 with K = 8 (Adam's
    momentum and variance, the parameters being their own master copy).
    """
    positive_number(params, "params", unit="parameters")
    nd = positive_int(dp, "dp (the number of data-parallel ranks)", TypeError)
    zero_stage(stage)
    if isinstance(optimizer_bytes, bool) or not isinstance(optimizer_bytes, (int, float)) \
            or optimizer_bytes < 0:
        raise ValueError(f"optimizer_bytes (K, bytes of optimizer state per parameter) must "
                         f"be >= 0, got {optimizer_bytes!r}")
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes)):
        positive_number(value, name, unit="bytes")
    out = {"params": float(param_bytes) * params / (nd if stage >= 3 else 1),
           "grads": float(grad_bytes) * params / (nd if stage >= 2 else 1),
           "optimizer": float(optimizer_bytes) * params / (nd if stage >= 1 else 1)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def shard_numel(numel: int, dp: int) -> int:
    """Elements of one rank's shard: the group padded to a multiple of ``dp``, divided."""
    return -(-int(numel) // dp)


def zero_rank_bytes(group_numels: list[int], dp: int, stage: int, param_bytes: int = 2,
                    grad_bytes: int = 2, optimizer_bytes: float = 12) -> dict[str, int]:
    """Bytes one rank holds under ``stage`` when the parameters form groups of
    ``group_numels`` elements (one group for stages 0 and 1, the buckets for stage 2, the
    units for stage 3), each padded to a multiple of ``dp``. ``optimizer_bytes`` is the
    per-element state (K): 12 for mixed-precision Adam, 2 x 8 for float64 Adam, 8 for
    float64 SGD with momentum. Returns {"params", "grads", "optimizer", "total"}."""
    zero_stage(stage)
    padded = sum(shard_numel(n, dp) * dp for n in group_numels)
    shard = padded // dp
    out = {"params": param_bytes * (shard if stage >= 3 else padded),
           "grads": grad_bytes * (shard if stage >= 2 else padded),
           "optimizer": int(optimizer_bytes * (shard if stage >= 1 else padded))}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def collectives_per_step(stage: int, root: bool = False) -> dict[str, int]:
    """How many times each group crosses the network per step: stage 0 all-reduces (counted
    as a reduce-scatter plus an all-gather, as a ring does it); stages 1 and 2 reduce-scatter
    and all-gather once; stage 3 all-gathers twice, except the ``root`` unit, once."""
    zero_stage(stage)
    gathers = 2 if stage == 3 and not root else 1
    return {"reduce_scatter": 1, "all_gather": gathers}


def zero_step_bytes(group_numels: list[int], dp: int, stage: int, elem_bytes: int,
                    root: list[bool] | None = None) -> int:
    """Bytes one rank sends per step on a ring: (p - 1)/p of each padded group per
    reduce-scatter and per all-gather. 2 Psi for stages 0-2, 3 Psi for stage 3."""
    root = root or [False] * len(group_numels)
    total = 0
    for n, is_root in zip(group_numels, root):
        calls = collectives_per_step(stage, is_root)
        total += sum(calls.values()) * (dp - 1) * shard_numel(n, dp) * elem_bytes
    return total


def zero_step_time(numel: int, dp: int, stage: int, alpha: float, beta: float,
                   elem_bytes: int = 2) -> float:
    """Seconds of communication per step on a ring, alpha-beta model: each collective is
    (p - 1) steps of one shard, (p - 1) (alpha + ceil(Psi / p) * bytes * beta). Here
    ``beta`` is seconds per byte (Hockney's form: pass ``1 / link.bandwidth``), not the
    bytes per second that ``collectives.time`` takes."""
    calls = sum(collectives_per_step(stage).values())
    return calls * (dp - 1) * (alpha + shard_numel(numel, dp) * elem_bytes * beta)
