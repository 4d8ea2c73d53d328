"""Horovod's helpers (``horovod/torch/functions.py``): start every rank from rank 0's
parameters and optimizer state, and send Python objects.

Objects travel as ``torch.save`` bytes and are read with ``torch.load(weights_only=True)``,
which rebuilds tensors and plain types (numbers, strings, lists, tuples, dicts) and refuses
anything else without running it; Horovod uses cloudpickle, which would run whatever the
sender packed. An object outside those types is refused on the sender, before any bytes
move, with the same error on every rank.
"""

from __future__ import annotations

import io

import torch

from .context import context
from .mpi_ops import allgather, broadcast_, broadcast_async_, synchronize


def broadcast_parameters(params, root_rank: int) -> None:
    """Copy rank ``root_rank``'s tensors into every rank's, in place: ``params`` is a
    ``state_dict()`` (broadcast in key order) or ``named_parameters()`` pairs."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    handles = []
    for i, (name, t) in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name or i!r} is a {type(t).__name__}, "
                            "not a tensor")
        handles.append(broadcast_async_(t.detach(), root_rank,
                                        name=f"broadcast.{name if name else i}"))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank: int) -> None:
    """Give every rank rank ``root_rank``'s optimizer state and hyper-parameters. An
    optimizer with no state yet (before its first step) first takes one step on zero
    gradients, as Horovod does, so that every rank has the state tensors to receive into
    (with weight decay that step moves the parameters, identically on every rank)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS (nor does Horovod)")
    if not optimizer.state:
        _create_state(optimizer)
    sd = optimizer.state_dict()
    handles, plain = [], {}
    for pid in sorted(sd["state"]):
        for key in sorted(sd["state"][pid]):
            value = sd["state"][pid][key]
            if isinstance(value, torch.Tensor):
                handles.append(broadcast_async_(value, root_rank, name=f"state.{pid}.{key}"))
            else:
                plain[(pid, key)] = value
    for h in handles:
        synchronize(h)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    groups, plain = broadcast_object((groups, plain), root_rank, name="optimizer.options")
    for g, options in zip(sd["param_groups"], groups):
        g.update(options)
    for (pid, key), value in plain.items():
        sd["state"][pid][key] = value
    optimizer.load_state_dict(sd)


def _create_state(optimizer) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    step = super(type(optimizer), optimizer).step if hasattr(optimizer, "skip_synchronize") \
        else optimizer.step
    step()  # the wrapped class's own step: there is nothing to average
    optimizer.zero_grad()


def _to_bytes(obj) -> torch.Tensor | None:
    """``obj`` as torch.save bytes, or None if ``weights_only`` would refuse it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    try:
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except Exception:
        return None
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _refused(rank: int) -> TypeError:
    return TypeError(f"rank {rank}'s object holds a type that torch.load(weights_only=True) "
                     "refuses; minidist.horovod sends only tensors and plain types (numbers, "
                     "strings, lists, tuples, dicts)")


def broadcast_object(obj, root_rank: int = 0, name=None):
    """Rank ``root_rank``'s ``obj`` on every rank (tensors and plain types only)."""
    name = name or "broadcast_object"
    me = context().comm.rank
    payload = _to_bytes(obj) if me == root_rank else None
    length = torch.tensor([-1 if payload is None else len(payload)], dtype=torch.int64)
    broadcast_(length, root_rank, name=f"{name}.length")
    if int(length) < 0:
        raise _refused(root_rank)
    buf = payload if me == root_rank else torch.empty(int(length), dtype=torch.uint8)
    broadcast_(buf, root_rank, name=f"{name}.data")
    if me == root_rank:
        return obj
    return torch.load(io.BytesIO(buf.numpy().tobytes()), weights_only=True)


def allgather_object(obj, name=None) -> list:
    """Every rank's ``obj``, by rank (tensors and plain types only)."""
    name = name or "allgather_object"
    payload = _to_bytes(obj)
    mine = torch.tensor([-1 if payload is None else len(payload)], dtype=torch.int64)
    lengths = allgather(mine, name=f"{name}.lengths").tolist()
    bad = [r for r, n in enumerate(lengths) if n < 0]
    if bad:
        raise _refused(bad[0])
    data = allgather(payload, name=f"{name}.data")
    out, start = [], 0
    for n in lengths:
        out.append(torch.load(io.BytesIO(data[start:start + n].numpy().tobytes()),
                              weights_only=True))
        start += n
    return out
