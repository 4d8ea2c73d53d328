"""Every private or undocumented piece of torch.distributed the backend relies on, in one
place, with the torch versions it was tested on.

torch's extension points for a backend written in Python are only partly public:
``Backend.register_backend`` and ``ProcessGroup`` are, but a Python subclass of
``ProcessGroup`` is reached from C++ (DDP's reducer, functional collectives, DTensor)
through a pybind trampoline (``torch/csrc/distributed/c10d/PyProcessGroup.hpp``) that
looks methods up by name, and some of those names changed between releases (torch 2.13
prefers ``all_gather_single_coalesced`` and falls back to ``allgather_into_tensor_coalesced``).
``TorchHooks`` below answers to every name either side uses and forwards to the backend's
own methods, so ``process_group.py`` speaks only minidist. The pattern follows torch's
own Python process groups: ``torch/testing/_internal/distributed/multi_threaded_pg.py``
and ``test/distributed/test_c10d_pypg.py``.

Importing this module on an untested torch raises, naming the versions tested, unless
``MINIDIST_TORCH_UNTESTED=1`` asks to try anyway.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReduceOp, _create_work_from_future
from torch.futures import Future

TESTED_TORCH = ("2.13",)  # major.minor releases the test suite passed on


def check_torch_version(version: str = torch.__version__) -> None:
    """Raise if ``version`` is not one the backend was tested on (``TESTED_TORCH``)."""
    minor = ".".join(version.split("+")[0].split(".")[:2])
    if minor in TESTED_TORCH or os.environ.get("MINIDIST_TORCH_UNTESTED") == "1":
        return
    raise RuntimeError(
        f"minidist's torch.distributed backend is tested on torch {', '.join(TESTED_TORCH)}, "
        f"and this is torch {version}: it relies on private parts of torch.distributed "
        "(listed in minidist/torch_backend/torch_private.py) that change between releases. "
        "Install a tested torch, or set MINIDIST_TORCH_UNTESTED=1 to try anyway")


check_torch_version()

# torch's ReduceOp -> minidist's op names (collectives/ops.py). BAND, BOR, BXOR and
# PREMUL_SUM have no minidist counterpart: the backend refuses them by name.
_OPS = {ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
        ReduceOp.PRODUCT: "prod"}


def reduce_op(opts, call: str) -> str:
    """The minidist op name for an options object's ``reduceOp``."""
    op = opts.reduceOp
    for torch_op, name in _OPS.items():
        if op == torch_op:
            return name
    kind = getattr(op, "op", op)
    raise ValueError(f"minidist backend: {call}: reduce op {str(kind).split('.')[-1]} is not "
                     "supported; minidist reduces with SUM, AVG, MAX, MIN and PRODUCT")


def root_rank(opts) -> int:
    return int(opts.rootRank)


def completed_work(result) -> dist.Work:
    """A Work that is already done (torch's pattern for synchronous Python groups)."""
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def work_from_future(fut: Future) -> dist.Work:
    """A Work that completes when ``fut`` does; ``wait()`` raises what ``fut`` raised.
    torch's C++ callers (DDP's reducer) chain on ``work.get_future()``."""
    return _create_work_from_future(fut)


def backend_options(opts) -> tuple:
    """What ``register_backend(..., extended_api=True)`` hands the creator:
    ``_DistributedBackendOptions`` (store, group_rank, group_size, timeout, group_id,
    global_ranks_in_group)."""
    return (opts.store, opts.group_rank, opts.group_size, opts.timeout, opts.group_id,
            list(opts.global_ranks_in_group))


class TorchHooks(dist.ProcessGroup):
    """The names torch calls on a Python process group, forwarded to the backend's own
    methods (``_allgather_into``, ``_reduce_scatter_from``, ``_all_to_all_flat``, ...).

    The group's name and description live here: torch's C++ base keeps them for its own
    groups, but for a Python group the trampoline asks the subclass (FSDP2, DTensor and the
    functional collectives resolve a group by its name)."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        self._group_name, self._group_desc = "", "undefined"

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "minidist"

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    # -- names that changed across releases: each forwards to one method -----------------
    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's names)
        return self._allgather_into(output, input)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002
        return self._allgather_into(output, input)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._allgather_into_coalesced(outputs, inputs)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._allgather_into_coalesced(outputs, inputs)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        return self._reduce_scatter_from(output, input, opts)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        return self._reduce_scatter_from(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter_from_coalesced(outputs, inputs, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter_from_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):  # noqa: A002
        return self._all_to_all_flat(output, input, output_splits, input_splits)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):  # noqa: A002
        return self._all_to_all_flat(output, input, output_splits, input_splits)

    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None,
                  group_desc=None):
        """torch 2.13's ``new_group`` asks the default group first when it has this method,
        on every rank (``_new_group_with_tag``): the backend splits its communicator, which
        needs every rank. Returns None on ranks outside ``ranks``."""
        if group_name is not None and not str(group_name).isdigit():
            # a hashed name: new_group(use_local_synchronization=True), called by members only
            raise ValueError("minidist backend: new_group(use_local_synchronization=True) is "
                             "not supported: a minidist sub-communicator comes from "
                             "comm.split, which every rank of the group calls; leave "
                             "use_local_synchronization=False")
        pg = self._split_group(list(ranks), group_name)
        if pg is not None:
            pg.setGroupName(str(group_name))
            pg.setGroupDesc(group_desc or "undefined")
        return pg
