"""What runs in exercise 08's tests, and their oracle: torch's own
``torch.amp.GradScaler``, run in the grader's process on the same numbers.

The learner's schedule runs closed loop (each step's output is the next step's input), as
a real scaler's state does. For the distributed parts each rank holds a different piece of
the model (a ZeRO shard, a tensor-parallel slice, a pipeline stage: different gradients on
every rank, so a local inf check is not enough), and the oracle is ONE process holding every
rank's piece under one torch GradScaler: the ranks together must step exactly as it does.
Every gradient, parameter and scale is exact in float32 (powers of two, small integers), so
the comparison is to rounding.
"""

from __future__ import annotations

import torch

from ...engine.calls import record_collectives
from ...engine.data import flag_value

SCHEDULE_CASES = [  # (label, init_scale, growth_factor, backoff_factor, growth_interval, flags)
    ("torch's defaults (init_scale=65536, growth_factor=2.0, backoff_factor=0.5, "
     "growth_interval=2000)", 65536.0, 2.0, 0.5, 2000,
     [0] * 2003 + [1] + [0] * 2001 + [1, 1, 0]),
    ("init_scale=8, growth_factor=2.0, backoff_factor=0.5, growth_interval=3", 8.0, 2.0, 0.5,
     3, [0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
    ("init_scale=16, growth_factor=3.0, backoff_factor=0.25, growth_interval=2", 16.0, 3.0,
     0.25, 2, [0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0]),
    # scale * growth_factor is inf: torch keeps the scale, and still resets the tracker
    ("init_scale=8, growth_factor=inf, backoff_factor=0.5, growth_interval=2", 8.0,
     float("inf"), 0.5, 2, [0, 0, 0, 1, 0, 0, 0, 0, 1]),
]
SHARD = 4  # parameters per rank
STEP_PLAN = {"steps": 10, "lr": 0.25, "momentum": 0.9, "init_scale": 1024.0,
             "growth_interval": 3}  # overflows: see ``overflows``
MASTER_PLAN = {"steps": 8, "lr": 128.0, "momentum": 0.0, "init_scale": 2.0 ** 14,
               "growth_interval": 3}


def overflows(world_size: int, steps: int) -> dict[int, tuple[int, str]]:
    """step -> (the one rank whose gradients overflow, "inf" or "nan"): the last rank at
    step 3 (after a growth at step 2), rank 0 at step 6 (a NaN), the middle rank at 7."""
    out = {3: (world_size - 1, "inf"), 6: (0, "nan")}
    if steps > 7:
        out[7] = (world_size // 2, "inf")
    return out


def torch_schedule(init: float, growth: float, backoff: float, interval: int,
                   flags: list[int]) -> list[tuple[float, int]]:
    """(scale, growth tracker) after each step, as torch.amp.GradScaler's update makes them."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_factor=growth,
                                  backoff_factor=backoff, growth_interval=interval)
    out = []
    for flag in flags:
        scaler.scale(torch.ones(()))
        p.grad = torch.full((1,), float("inf") if flag else 1.0)
        scaler.step(opt)
        scaler.update()
        state = scaler.state_dict()
        out.append((float(state["scale"]), int(state["_growth_tracker"])))
    return out


def as_pair(got) -> tuple[float, int] | None:
    """``(scale, tracker)`` from what update_scale returned (numbers or one-element
    tensors); None if it is not two numbers."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return None
    try:
        return float(got[0]), int(got[1])
    except (TypeError, ValueError, RuntimeError):
        return None


def schedule_run(namespace, init, growth, backoff, interval, flags) -> list:
    """The learner's update_scale, closed loop, from (init, 0): what each step returned
    (``(scale, tracker)``, or ``{"returned": repr}`` and stop)."""
    fn, scale, tracker, out = namespace["update_scale"], init, 0, []
    for flag in flags:
        got = fn(scale, tracker, bool(flag), growth, backoff, interval)
        pair = as_pair(got)
        if pair is None:
            return out + [{"returned": repr(got)[:120]}]
        out.append(pair)
        scale, tracker = pair
    return out


def record_calls() -> list[dict]:
    """From now on in this process, every md collective call (however imported) appends
    {"name", "numel", "op"} to the list returned."""
    calls: list[dict] = []
    record_collectives(lambda c: calls.append({"name": c.name, "numel": c.numel, "op": c.op}))
    return calls


def agree_case(comm, namespace, flags: list[int]) -> dict:
    """The learner's agree_found_inf on this rank, given this rank's own flag: what it
    returned and the md collectives it called."""
    calls = record_calls()
    value = flag_value(namespace["agree_found_inf"](comm, bool(flags[comm.rank])))
    return {"flag": value, "calls": list(calls)}


# -- a training loop's steps on each rank ----------------------------------------------------
def initial_shard(rank: int) -> torch.Tensor:
    return 1.0 + rank + 0.25 * torch.arange(SHARD, dtype=torch.float32)


def true_grad(step: int, rank: int, master: bool) -> torch.Tensor:
    """The unscaled gradient of rank's piece at a step. For the master-weight test they are
    ~2^-20, below float16's smallest normal (2^-14): (1 + j/256) * 2^-20 keeps its low bits
    only in float32 (or scaled into float16's range); in float16 it is 16 subnormal steps."""
    j = torch.arange(SHARD, dtype=torch.float32)
    if master:
        return (1 + (j + 8 * rank + 3 * step + 1) / 256) * 2.0 ** -20
    return ((step % 3) + 1) * (rank + 1) * (j + 1) / 16


def scaled_grad(step: int, rank: int, scale: float, bad, master: bool) -> torch.Tensor:
    """What backward of loss * scale leaves in .grad (float16 for the master test), with an
    inf or NaN where this rank overflows at this step."""
    g = true_grad(step, rank, master) * scale
    g = g.half() if master else g
    if bad.get(step, (None,))[0] == rank:
        g[1] = float(bad[step][1])
    return g


def number(x):
    try:
        return float(x)
    except (TypeError, ValueError, RuntimeError):
        return repr(x)[:60]


def new_state(plan: dict) -> dict:
    return {"scale": plan["init_scale"], "growth_tracker": 0, "growth_factor": 2.0,
            "backoff_factor": 0.5, "growth_interval": plan["growth_interval"]}


def step_case(comm, namespace, plan: dict, master: bool) -> list:
    """Each step on this rank: fresh scaled gradients, then the learner's scaled_step (or,
    with ``master``, master_step on a float16 model and its float32 master copy)."""
    rank, bad = comm.rank, overflows(comm.world_size, plan["steps"])
    param = torch.nn.Parameter(initial_shard(rank))
    model = torch.nn.Parameter(initial_shard(rank).half()) if master else None
    opt = torch.optim.SGD([param], lr=plan["lr"], momentum=plan["momentum"])
    state, out = new_state(plan), []
    for step in range(plan["steps"]):
        scale = number(state.get("scale"))
        scale = scale if isinstance(scale, float) else plan["init_scale"]
        if master:
            model.grad = scaled_grad(step, rank, scale, bad, True)
            got = namespace["master_step"](comm, [model], [param], opt, state)
        else:
            param.grad = scaled_grad(step, rank, scale, bad, False)
            got = namespace["scaled_step"](comm, opt, state)
        out.append({"stepped": flag_value(got), "param": param.detach().clone(),
                    "model": model.detach().clone() if master else None,
                    "scale": number(state.get("scale")),
                    "tracker": number(state.get("growth_tracker"))})
    return out


def torch_steps(world_size: int, plan: dict, master: bool) -> list[dict]:
    """The oracle: one process, every rank's piece, one torch.amp.GradScaler."""
    bad = overflows(world_size, plan["steps"])
    params = [torch.nn.Parameter(initial_shard(r)) for r in range(world_size)]
    opt = torch.optim.SGD(params, lr=plan["lr"], momentum=plan["momentum"])
    scaler = torch.amp.GradScaler("cpu", init_scale=plan["init_scale"],
                                  growth_interval=plan["growth_interval"])
    out = []
    for step in range(plan["steps"]):
        scaler.scale(torch.ones(()))
        for r, p in enumerate(params):
            p.grad = scaled_grad(step, r, scaler.get_scale(), bad, master).float()
        scaler.step(opt)
        scaler.update()
        state = scaler.state_dict()
        out.append({"stepped": step not in bad, "params": [p.detach().clone() for p in params],
                    "bufs": [_buffer(opt, p) for p in params],
                    "scale": float(state["scale"]), "tracker": int(state["_growth_tracker"])})
    return out


def _buffer(opt, p) -> torch.Tensor | None:
    buf = opt.state.get(p, {}).get("momentum_buffer")
    return None if buf is None else buf.clone()
