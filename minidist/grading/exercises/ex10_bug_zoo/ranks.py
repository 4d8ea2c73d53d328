"""What runs on each rank in exercise 10's tests, and the oracles.

Each case builds the same small, seeded problem on every rank, hands it to the learner's
fixed function and returns what came out (gradients, the summed tensor, the samples each
epoch visited, parameters after each step, a pipeline's loss and gradients). The oracle
computes the same problem in ONE process, the way the bug-free code must: the mean of every
rank's gradient, the sum over ranks, torch's ``DistributedSampler`` with ``set_epoch``, one
process holding every shard, the float32 gradient, the pipeline's layers composed. Everything
is float64 (exact) except the float16 step, where the oracle is float32.
"""

from __future__ import annotations

import torch

from ....errors import CommTimeout
from ...engine.calls import record_collectives
from ...engine.compare import Tolerance
from ...engine.compare import close as _close
from ...engine.data import flag_value, pattern


def close(a, b, tol: float = 1e-9) -> bool:
    """``a`` is a tensor of ``b``'s shape, equal to it within ``tol`` (relative and
    absolute); ``tol=0``: exactly."""
    return _close(a, b, Tolerance(tol, tol))


# -- bug 1: gradients summed, not averaged -----------------------------------------------------
def _linear(seed: int, n_in: int, n_out: int, dtype=torch.float64) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out).to(dtype)


def _batch(seed: int, rank: int, rows: int, n_in: int, n_out: int):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.randn(rows, n_in, generator=g, dtype=torch.float64),
            torch.randn(rows, n_out, generator=g, dtype=torch.float64))


def local_grads(seed: int, rank: int) -> list[torch.Tensor]:
    """A rank's own gradients: a Linear(3, 2) on its 4 samples, mean squared error."""
    model = _linear(seed, 3, 2)
    x, y = _batch(seed, rank, 4, 3, 2)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def average_case(comm, namespace, seed: int) -> list:
    model = _linear(seed, 3, 2)
    x, y = _batch(seed, comm.rank, 4, 3, 2)
    torch.nn.functional.mse_loss(model(x), y).backward()
    namespace["average_gradients"](comm, model)
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def mean_grads(seed: int, world_size: int) -> list[torch.Tensor]:
    """The oracle: the gradient of one process on every rank's samples (equal shares)."""
    per_rank = [local_grads(seed, r) for r in range(world_size)]
    return [sum(g[i] for g in per_rank) / world_size for i in range(len(per_rank[0]))]


# -- bug 2: a ring that sends whole buffers ----------------------------------------------------
def ring_case(comm, namespace, n: int) -> torch.Tensor:
    x = pattern(comm.rank, n, torch.float64, comm.world_size)
    namespace["ring_all_reduce"](comm, x)
    return x


def ring_sum(n: int, world_size: int) -> torch.Tensor:
    return sum(pattern(r, n, torch.float64, world_size) for r in range(world_size))


# -- bug 3: found_inf not agreed ---------------------------------------------------------------
STEP_PLAN = {"steps": 5, "lr": 0.25, "scale": 1024.0}


def overflow(world_size: int) -> dict[int, tuple[int, str]]:
    """step -> (the one rank whose gradients overflow, "inf" or "nan")."""
    return {1: (min(1, world_size - 1), "inf"), 3: (0, "nan")}


def shard_grad(step: int, rank: int, scale: float, world_size: int) -> torch.Tensor:
    g = ((step % 3) + 1) * (rank + 1) * torch.arange(1.0, 5.0, dtype=torch.float64) / 8
    g = g * scale
    bad = overflow(world_size).get(step)
    if bad and bad[0] == rank:
        g[2] = float(bad[1])
    return g


def first_shard(rank: int) -> torch.Tensor:
    return 1.0 + rank + 0.25 * torch.arange(4, dtype=torch.float64)


def sharded_case(comm, namespace, plan: dict) -> list:
    param = torch.nn.Parameter(first_shard(comm.rank))
    opt = torch.optim.SGD([param], lr=plan["lr"])
    state, out = {"scale": plan["scale"]}, []
    for step in range(plan["steps"]):
        param.grad = shard_grad(step, comm.rank, float(state["scale"]), comm.world_size)
        stepped = namespace["sharded_step"](comm, opt, state)
        out.append({"param": param.detach().clone(), "scale": float(state["scale"]),
                    "stepped": flag_value(stepped)})
    return out


def sharded_oracle(world_size: int, plan: dict) -> list[dict]:
    """One process holding every rank's shard: skip when ANY shard overflowed."""
    params, scale, out = [first_shard(r) for r in range(world_size)], plan["scale"], []
    for step in range(plan["steps"]):
        if step in overflow(world_size):
            scale /= 2
        else:
            params = [w - plan["lr"] * shard_grad(step, r, scale, world_size) / scale
                      for r, w in enumerate(params)]
        out.append({"params": [w.clone() for w in params], "scale": scale,
                    "stepped": step not in overflow(world_size)})
    return out


# -- bug 4: the sampler's epoch ----------------------------------------------------------------
def sampler_case(comm, namespace, n: int, epochs: int) -> list[int]:
    seen: list[int] = []
    namespace["train_epochs"](comm, torch.arange(n), epochs,
                              lambda batch: seen.extend(torch.as_tensor(batch).tolist()))
    return seen


def sampler_oracle(n: int, rank: int, world_size: int, epochs: int) -> list[list[int]]:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, seed=0)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


# -- bug 5: a ZeRO shard off by the padding ----------------------------------------------------
ZERO_LR = 0.5


def zero_start(n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)


def zero_grad(n: int, rank: int, world_size: int) -> torch.Tensor:
    """Generic values, so that a misplaced element cannot pass for the right one."""
    g = torch.Generator().manual_seed(100 * n + rank)
    return torch.randn(n, generator=g, dtype=torch.float64)


ZERO_WATCHED = ("all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast")


def zero_case(comm, namespace, n: int, lr: float) -> dict:
    """The parameters after the learner's step, and the library collectives it called
    (name, elements): ZeRO's signature is a gradient reduce-scattered and shards
    all-gathered, never the whole gradient all-reduced."""
    calls: list[list] = []
    gathered: list = []  # what each md.all_gather sent: the updated shard, not the gradient

    def record(c) -> None:
        calls.append([c.name, c.numel if isinstance(c.sent, torch.Tensor) else -1])
        if c.name == "all_gather" and isinstance(c.sent, torch.Tensor):
            gathered.append(c.sent.detach().clone())

    record_collectives(record, ZERO_WATCHED)
    params = zero_start(n)
    namespace["zero_sgd_step"](comm, params, zero_grad(n, comm.rank, comm.world_size), lr)
    return {"params": params, "calls": calls, "gathered": gathered}


def zero_mean_grad(n: int, world_size: int) -> torch.Tensor:
    return sum(zero_grad(n, r, world_size) for r in range(world_size)) / world_size


# -- bug 6: float16 without loss scaling -------------------------------------------------------
FP16 = {"steps": 2, "lr": 64.0, "rows": 8, "n_in": 8, "n_out": 4, "delta": 2.0 ** -22}


def fp16_data(rank: int, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs, and targets the float16 model's output misses by ~2^-22: the gradient of the
    mean squared error at the output is 2 delta / 32 ~ 2^-26 per element, below float16's
    smallest subnormal (2^-24), so unscaled it rounds to 0 on its way into float16."""
    g = torch.Generator().manual_seed(7 + rank)
    x = (torch.rand(FP16["rows"], FP16["n_in"], generator=g) * 2 - 1).half()
    signs = torch.randint(0, 2, (FP16["rows"], FP16["n_out"]), generator=g) * 2 - 1
    with torch.no_grad():
        y = model(x).float() - FP16["delta"] * signs * (1 + rank)
    return x, y


def fp16_model() -> torch.nn.Linear:
    torch.manual_seed(3)
    return torch.nn.Linear(FP16["n_in"], FP16["n_out"]).half()


def fp16_case(comm, namespace) -> list:
    model = fp16_model()
    masters = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    opt = torch.optim.SGD(masters, lr=FP16["lr"])
    x, y = fp16_data(comm.rank, model)
    out = []
    for _ in range(FP16["steps"]):
        namespace["fp16_step"](comm, model, masters, opt, x, y)
        out.append([w.detach().clone() for w in masters])
    return out


def fp16_oracle(world_size: int, ranks=None) -> list[list[torch.Tensor]]:
    """Float32 gradients of the same problem (the float16 model's outputs, every rank's
    share averaged), applied to float32 masters: what loss scaling recovers. ``ranks``:
    only those ranks' shares (one rank's alone: a step that never averaged)."""
    model = fp16_model()
    masters = [p.detach().float() for p in model.parameters()]
    grads = [torch.zeros_like(w) for w in masters]
    ranks = range(world_size) if ranks is None else ranks
    for r in ranks:
        x, y = fp16_data(r, model)
        with torch.no_grad():
            out = model(x).float()
        d = 2 * (out - y) / y.numel()  # d loss / d output, float32
        grads[0] += d.T @ x.float() / len(ranks)
        grads[1] += d.sum(0) / len(ranks)
    out = []
    for _ in range(FP16["steps"]):
        masters = [w - FP16["lr"] * g for w, g in zip(masters, grads)]
        out.append(masters)
    return out


# -- bug 7: 1F1B that deadlocks ----------------------------------------------------------------
WIDTH, ROWS = 3, 2
_SKIP = {"after_deadlock": False}
_AGREE_TAG = -(1 << 40)


def stage_layer(stage: int) -> torch.nn.Linear:
    return _linear(50 + stage, WIDTH, WIDTH)


def micro_inputs(m: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(m)
    return [torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64) for _ in range(m)]


def micro_loss(y: torch.Tensor, i: int) -> torch.Tensor:
    return ((torch.tanh(y) - 0.1 * (i + 1)) ** 2).sum()


def pipeline_case(comm, namespace, m: int) -> dict:
    """One 1F1B step of this stage; a deadlock is caught here (and agreed on, so that every
    rank skips the world's remaining cases instead of waiting on them again)."""
    if _SKIP["after_deadlock"]:
        return {"skipped": True}
    layer, counts, order = stage_layer(comm.rank), {"F": 0, "B": 0}, []

    def note(kind: str) -> None:
        counts[kind] += 1
        order.append(kind)

    layer.register_forward_hook(lambda *_: note("F"))
    layer.weight.register_hook(lambda g: note("B"))
    xs = micro_inputs(m) if comm.rank == 0 else [torch.zeros(ROWS, WIDTH, dtype=torch.float64)
                                                 for _ in range(m)]
    out: dict = {}
    try:
        loss = namespace["pipeline_1f1b"](comm, layer, xs, micro_loss)
        out["loss"] = float(loss) if comm.rank == comm.world_size - 1 else None
        out["grads"] = [None if p.grad is None else p.grad.clone() for p in layer.parameters()]
    except CommTimeout as e:
        out["blocked"] = {"op": e.op, "peer": e.peer}
    out.update(counts)
    out["order"] = "".join(order)  # the schedule's signature: F and B in the order they ran
    if _any_rank(comm, "blocked" in out):
        _SKIP["after_deadlock"] = True
    return out


def _any_rank(comm, flag: bool) -> bool:
    """OR over the ranks on the control channel (where no learner message can be), waiting
    long enough for a rank that is still timing out of a deadlock."""
    control, p, limit = comm.control, comm.world_size, 3 * comm.timeout
    box = torch.tensor([int(flag)], dtype=torch.int64)
    if comm.rank == 0:
        for src in range(1, p):
            other = torch.zeros(1, dtype=torch.int64)
            control.irecv(other, src, _AGREE_TAG).wait(timeout=limit)
            box |= other
        for dst in range(1, p):
            control.isend(box, dst, _AGREE_TAG - 1).wait(timeout=limit)
    else:
        control.isend(box, 0, _AGREE_TAG).wait(timeout=limit)
        control.irecv(box, 0, _AGREE_TAG - 1).wait(timeout=limit)
    return bool(box.item())


def pipeline_oracle(world_size: int, m: int) -> dict:
    """One process: the stages' layers composed, the micro-batches' losses summed."""
    layers = [stage_layer(s) for s in range(world_size)]
    total = 0.0
    for i, x in enumerate(micro_inputs(m)):
        for layer in layers:
            x = layer(x)
        loss = micro_loss(x, i)
        loss.backward()
        total += loss.item()
    return {"loss": total, "grads": [[p.grad.clone() for p in layer.parameters()]
                                     for layer in layers]}
