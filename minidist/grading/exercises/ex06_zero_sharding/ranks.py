"""What runs on each rank in exercise 06's tests: the test data, the optimizers, and one case
on one rank for the learner's ``zero1_step`` (:func:`step_case`) and ``reduce_bucket``
(:func:`bucket_case`); and what a rank's optimizer covering the wrong elements says.

The optimizer reaches the learner's step through a factory, :class:`OptimizerLog`, which
records how many elements each optimizer it builds covers: that is how the test sees what a
rank keeps optimizer state for (its shard, or the whole vector), without looking inside the
learner's ``state``. Gradients are small integers, so that their sum over any number of ranks
is exact in any order and the averaged gradient has one right value.
"""

from __future__ import annotations

import torch

from ....errors import CommTimeout
from ...engine.calls import record_collectives

STEPS = 3  # optimizer steps per case: momentum and Adam's moments must carry over
OPTIMIZERS = {  # name -> (description, factory over a list of tensors)
    "sgd": ("SGD with momentum 0.9", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    "adamw": ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1)),
}


def shard_numel(numel: int, world_size: int) -> int:
    """ceil(numel / world_size): every rank's shard of the padded flat vector."""
    return -(-numel // world_size)


def padding_text(numel: int, p: int) -> str:
    """``with 10 elements on 4 ranks each shard is 3 (2 padding elements on rank 3)``."""
    s = shard_numel(numel, p)
    pads = [(q, min((q + 1) * s, s * p) - max(q * s, numel)) for q in range(p)]
    pads = [(q, k) for q, k in pads if k > 0]
    total = s * p - numel
    head = f"{total} padding element{'s' if total != 1 else ''}"
    if not pads:
        where = "no padding"
    elif len(pads) == 1:
        where = f"{head} on rank {pads[0][0]}"
    else:
        where = f"{head}: " + ", ".join(f"{k} on rank {q}" for q, k in pads)
    return f"with {numel} elements on {p} ranks each shard is {s} ({where})"


def initial_params(numel: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 + numel)
    return torch.randn(numel, generator=g, dtype=torch.float64)


def rank_grad(rank: int, numel: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s gradient at ``step``: integers in [-8, 8], different on every rank."""
    g = torch.Generator().manual_seed(1000 * step + 31 * rank + numel)
    return torch.randint(-8, 9, (numel,), generator=g).to(torch.float64)


class OptimizerLog:
    """The ``make_optimizer`` the learner's step is given: builds the test's optimizer over
    the tensors passed and notes how many elements they hold."""

    def __init__(self, name: str):
        self.factory, self.sizes = OPTIMIZERS[name][1], []

    def __call__(self, params):
        ps = [params] if isinstance(params, torch.Tensor) else list(params)
        if not ps or not all(isinstance(p, torch.Tensor) for p in ps):
            raise TypeError("make_optimizer takes a list of tensors (the parameters it "
                            f"updates), as torch.optim.SGD does; got {params!r:.60}")
        self.sizes.append(sum(p.numel() for p in ps))
        return self.factory(ps)


class ShardMistake(RuntimeError):
    """The learner's step failed, and what its optimizer covers says why."""


def optimizer_problem(sizes: list[int], steps: int, numel: int, p: int, rank: int) -> str | None:
    """What is wrong with the optimizers rank ``rank`` built in ``steps`` steps (``sizes``:
    the elements each covers), as a sentence; None if it built one over its shard."""
    s, at = shard_numel(numel, p), f"rank {rank}"
    if not sizes:
        return (f"{at} never called make_optimizer: build the optimizer of this rank's shard "
                "with it on the first step and keep it in state") if steps else None
    if len(sizes) > 1:
        return (f"{at} called make_optimizer {len(sizes)} times in {steps} step(s): a new "
                "optimizer starts its momentum (Adam's moments) afresh. Build it on the first "
                "step, keep it in state and reuse it")
    if sizes[0] == s:
        return None
    if sizes[0] >= numel:
        return (f"{at} updated the full tensor (its optimizer state holds {sizes[0]} elements, "
                f"its shard is {s}): in stage 1 each rank builds its optimizer over its own "
                "shard only, so that each holds 1/p of the optimizer state")
    return (f"{at}'s optimizer holds {sizes[0]} elements, its shard {s}: the shard boundaries "
            f"ignore padding: {padding_text(numel, p)}")


def step_case(comm, namespace, numel: int, optimizer: str) -> dict:
    """``STEPS`` calls of the learner's ``zero1_step`` on this rank; the parameters after
    each, the sizes of the optimizers it built and the collectives of each step (name,
    elements sent). If the step fails and its optimizer's size says why, that is the error
    (``ShardMistake``)."""
    fn, log = namespace["zero1_step"], OptimizerLog(optimizer)
    params, state, history, calls = initial_params(numel), {}, [], []
    record(calls)
    for step in range(STEPS):
        calls.append([])
        try:
            fn(comm, params, rank_grad(comm.rank, numel, step), state, log)
        except CommTimeout:
            raise
        except Exception as e:
            problem = optimizer_problem(log.sizes, step + 1, numel, comm.world_size, comm.rank)
            if problem and log.sizes:
                raise ShardMistake(f"{problem} (and step {step + 1} then failed: "
                                   f"{type(e).__name__}: {e})") from e
            raise
        history.append(params.detach().clone())
    return {"history": history, "sizes": log.sizes, "step": STEPS, "calls": calls}


BUCKET_PASSES = 2  # backward passes: the shard accumulates


def record(steps: list) -> None:
    """Append each md collective this process calls (name, elements sent) to ``steps[-1]``."""
    record_collectives(lambda c: steps[-1].append({"name": c.name, "numel": c.numel}))


def bucket_case(comm, namespace, numel: int, buckets: list[tuple[int, int]]) -> dict:
    """Every bucket of ``BUCKET_PASSES`` backward passes through the learner's
    ``reduce_bucket``, into one gradient shard; the shard, how many times ``md.all_reduce``
    ran (under any name), and every collective each call of the first pass made (name,
    elements, and the destination of a reduce)."""
    fn, r = namespace["reduce_bucket"], comm.rank
    grad_shard = torch.zeros(shard_numel(numel, comm.world_size), dtype=torch.float64)
    calls, made = [], []

    def recorder(c) -> None:
        if c.name == "all_reduce":
            calls.append(1)
        made.append({"name": c.name, "numel": c.numel, "dst": c.dst})

    record_collectives(recorder)
    per_bucket = []
    for step in range(BUCKET_PASSES):
        full = rank_grad(r, numel, step)
        for lo, hi in buckets:
            made.clear()
            fn(comm, full[lo:hi].clone(), lo, grad_shard)
            if step == 0:
                per_bucket.append(list(made))
    return {"grad_shard": grad_shard, "all_reduces": len(calls), "calls": per_bucket}
