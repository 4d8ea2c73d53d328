"""Starting identical: every data-parallel replica checks that the ranks hold the same model
(names, shapes, dtypes, order) and then takes rank 0's parameters and buffers, so that the
replicas begin from the same point and, averaging the same gradients, stay there.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from ...collectives import broadcast
from ...collectives.agreement import disagreement
from ...comm.tensors import REDUCIBLE_DTYPES


# -- starting identical ------------------------------------------------------------------------
def sync_module_states(comm, module: nn.Module) -> None:
    """Check that every rank has the same parameters and buffers (names, shapes, dtypes,
    requires_grad, order), then broadcast rank 0's values to all ranks."""
    check_same_structure(comm, module)
    broadcast_tensors(comm, [p.detach() for p in module.parameters()]
                      + [b for b in module.buffers()])


def _structure(module: nn.Module) -> list[list]:
    params = [["param", n, list(p.shape), str(p.dtype), p.requires_grad]
              for n, p in module.named_parameters()]
    return params + [["buffer", n, list(b.shape), str(b.dtype), False]
                     for n, b in module.named_buffers()]


def check_same_structure(comm, module: nn.Module) -> None:
    """Raise the same ValueError on every rank if any rank's module differs from rank 0's.

    Ranks first compare a digest (``collectives.agreement.disagreement``); only on a
    mismatch do they exchange their full descriptions, to say exactly what differs."""
    texts = disagreement(comm, json.dumps(_structure(module)), op="same-model check")
    if texts is not None:
        raise ValueError(describe_mismatch([json.loads(t) for t in texts]))


def describe_mismatch(structures: list[list]) -> str:
    """Name the first difference between rank 0's module and another rank's."""
    head = ("DistributedDataParallel needs the same model on every rank (parameter and buffer "
            "names, shapes, dtypes, requires_grad, in the same order), but ")
    ref = {e[1]: e for e in structures[0]}
    for r, entries in enumerate(structures[1:], start=1):
        mine = {e[1]: e for e in entries}
        for name in (n for n in ref if n not in mine):
            return head + f"rank {r} has no {ref[name][0]} {name!r}, which rank 0 has"
        for name in (n for n in mine if n not in ref):
            return head + f"rank {r} has a {mine[name][0]} {name!r}, which rank 0 lacks"
        for name, e in ref.items():
            for what, i in (("shape", 2), ("dtype", 3), ("requires_grad", 4)):
                if mine[name][i] != e[i]:
                    return head + (f"{e[0]} {name!r} has {what} {_show(e[i])} on rank 0 and "
                                   f"{_show(mine[name][i])} on rank {r}")
        if [e[1] for e in entries] != [e[1] for e in structures[0]]:
            return head + f"rank {r} registers its parameters in a different order than rank 0"
    return head + "the ranks' models differ"


def _show(value) -> str:
    return str(tuple(value)) if isinstance(value, list) else str(value)


def broadcast_tensors(comm, tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` with rank ``src``'s values: one broadcast per dtype, of all the
    tensors of that dtype flattened together (few large messages beat many small ones)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for dtype, group in by_dtype.items():
            wire = dtype if dtype in REDUCIBLE_DTYPES else torch.int64  # e.g. bool buffers
            flat = torch.cat([t.reshape(-1).to(wire) for t in group])
            broadcast(comm, flat, src=src)
            for t, chunk in zip(group, flat.split([t.numel() for t in group])):
                t.copy_(chunk.view_as(t))


def check_args(module, comm) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not (hasattr(comm, "rank") and hasattr(comm, "world_size") and hasattr(comm, "isend")):
        raise TypeError("comm must be a minidist Communicator (the first argument md.launch "
                        f"passes to your function, or md.init()), got {type(comm).__name__}")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError("data parallelism needs a module with at least one parameter that "
                         "requires a gradient; this one has none")
