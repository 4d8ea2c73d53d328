"""The sandbox's rules as data: one :class:`Rule` per name a test lists in
``GradedTest.rules``, saying what of the library and of torch is out of the learner's reach
while that test runs, and why (``why``, the sentence every refusal ends with). What the
learner builds on stays (``md.all_reduce`` under ``DATA_PARALLEL``, ``comm.split`` under
``MESH``, the pipeline simulator under ``PIPELINE``): each rule's ``why`` names it.
``sandbox.py`` applies them (and re-exports every name here).

- ``COLLECTIVES`` also makes the rank's transport refuse the collectives' context (the one
  ``comm.collective`` talks on) and every capability (``sandbox.guard``): the learner's bytes
  all go through point-to-point calls.
- ``SENDRECV``: ``comm.sendrecv`` raises (and a rank's timeline shows any call that got past).
- ``FIT``: every least-squares fit of the library (``minidist.bench``'s), under every name.
- ``COMM_EFFICIENCY`` also refuses ``md.all_reduce(..., algorithm="hierarchical")`` and turns
  the shared-memory all_reduce off, so that every byte a collective moves is a message; the
  modules it names may be missing (not written yet): those are skipped.

Every refusal raises :class:`NotAllowed`, whose message says what is not allowed and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

COLLECTIVES, SENDRECV, SAMPLER = "collectives", "sendrecv", "sampler"
BUCKETS, DATA_PARALLEL, FIT, PREDICT = "buckets", "data_parallel", "fit", "predict"
PARAM_SERVER, TENSOR_PARALLEL, PIPELINE = "param_server", "tensor_parallel", "pipeline"
ZERO, MESH, AMP, COMM_EFFICIENCY = "zero", "mesh", "amp", "comm_efficiency"
NOT_ALLOWED_TEXT = "is not allowed in this exercise"


@dataclass(frozen=True)
class Rule:
    """What one rule refuses. ``functions``: modules whose every function raises; ``named``:
    (module, function) pairs; ``classes``: (module, class, methods; None: every function the
    class defines); ``packages``: modules or packages whose every function and class method
    raises (in every submodule but ``SPARED``; with ``optional``, one that is missing or does
    not import is skipped); ``torch_ops``: torch's built-in operators (not Python code:
    replaced, not rewritten); ``torch_distributed``: no process group, no torch collective;
    ``then``: what else the rule does, after the rest."""

    why: str
    functions: tuple[str, ...] = ()
    named: tuple[tuple[str, str], ...] = ()
    classes: tuple[tuple[str, str, tuple[str, ...] | None], ...] = ()
    packages: tuple[str, ...] = ()
    optional: bool = False
    torch_ops: tuple[str, ...] = ()
    torch_distributed: bool = False
    then: Callable[[], None] | None = None


class NotAllowed(RuntimeError):
    """The learner's code called what the exercise asks them to build."""


def message(what: str, rule: str) -> str:
    return f"{what} {NOT_ALLOWED_TEXT}: {RULES[rule].why}"


def _comm_efficiency_paths() -> None:
    """``COMM_EFFICIENCY``'s refusal of the hierarchical path inside ``md.all_reduce`` and
    its shared-memory path off (see the module docstring)."""
    from ...collectives import api, shared_memory
    from .sandbox import constant, observe

    def no_hierarchical(original, comm, t, *args, **kwargs):
        if "hierarchical" in (*args[1:2], kwargs.get("algorithm")):
            raise NotAllowed(message('md.all_reduce(..., algorithm="hierarchical")',
                                     COMM_EFFICIENCY))
        return original(comm, t, *args, **kwargs)

    observe(api.all_reduce, no_hierarchical)
    # not observed: an observed function's original stays reachable from the learner's code
    # (the wrapper's globals); this one's code is replaced and nothing keeps the old one
    constant(shared_memory.available, False)


_DATA = "minidist.parallel.data."
RULES = {
    COLLECTIVES: Rule(
        "you are building a collective from point-to-point messages here: use comm.send, "
        "comm.recv, comm.isend and comm.irecv",
        functions=("minidist.collectives.api", "minidist.collectives.allreduce",
                   "minidist.collectives.rooted", "minidist.collectives.shared_memory",
                   "minidist.collectives.auto"),
        torch_distributed=True),
    SENDRECV: Rule("order comm.send and comm.recv yourself (or post comm.irecv first)"),
    SAMPLER: Rule(
        "shard_indices is the sampler's own logic: write it from the description",
        named=(("minidist.parallel.data.sampler", "shard_indices"),),
        classes=(("torch.utils.data.distributed", "DistributedSampler", ("__init__", "__iter__")),
                 ("minidist.parallel.data.sampler", "DistributedSampler",
                  ("__init__", "__iter__")))),
    BUCKETS: Rule("assign_buckets is DDP's own rule: write it from the description",
                  named=(("minidist.parallel.data.buckets", "assign_buckets"),)),
    DATA_PARALLEL: Rule(
        "you are building data parallelism's mechanism here: register the hooks and call "
        "md.all_reduce yourself",
        named=(("minidist.collectives.api", "all_reduce_coalesced"),
               ("minidist.parallel.data.buckets", "assign_buckets"),
               ("minidist.parallel.data.buckets", "allreduce_hook")),
        classes=((_DATA + "ddp", "DistributedDataParallel", None),
                 (_DATA + "naive", "DataParallelNaive", None),
                 (_DATA + "scheduler", "BucketScheduler", None),
                 (_DATA + "scheduler", "CommThread", None),
                 (_DATA + "buckets", "Bucket", None),
                 (_DATA + "reductions", "Average", None),
                 (_DATA + "reductions", "CommHook", None),
                 ("torch.nn.parallel", "DistributedDataParallel", ("__init__",))),
        torch_distributed=True),
    FIT: Rule(  # every fit of the library; bench.p2p's name last: its refusal names that one
        "write the least-squares fit yourself (np.linalg.lstsq)",
        named=(("minidist.bench.timing", "fit_relative"),
               ("minidist.bench.collectives", "fit_path"),
               ("minidist.bench.timing", "fit_alpha_beta"),
               ("minidist.bench.p2p", "fit_alpha_beta"))),
    PREDICT: Rule("write the alpha-beta formula yourself",
                  named=(("minidist.costmodel.collectives", "time"),),
                  classes=(("minidist.transports.network", "Link", ("time",)),
                           ("minidist.costmodel.collectives", "Terms", ("time",)))),
    PARAM_SERVER: Rule(
        "you are building the parameter server's loop and rules here: use comm.send and "
        "comm.recv",
        functions=("minidist.parallel.param_server.rules",),
        classes=(("minidist.parallel.param_server.parameter_server", "ParameterServer", None),
                 ("minidist.parallel.param_server.server", "ShardServer", None),
                 ("minidist.parallel.param_server.worker", "WorkerClient", None))),
    TENSOR_PARALLEL: Rule(
        "you are building Megatron's operators and parallel layers here: write them with "
        "md.all_reduce and torch.autograd.Function",
        packages=("minidist.parallel.tensor",), torch_distributed=True),
    PIPELINE: Rule(
        "you are writing the 1F1B schedule and a stage's messages here: write them from the "
        "description (md.pipeline.simulate stays, to check your lists)",
        packages=("minidist.parallel.pipeline",)),
    ZERO: Rule(
        "you are writing ZeRO's sharded step here: build it from md.reduce_scatter (or "
        "md.all_reduce), md.reduce and md.all_gather",
        classes=(("torch.distributed.optim.zero_redundancy_optimizer",
                  "ZeroRedundancyOptimizer", ("__init__", "step")),),
        packages=("minidist.parallel.zero",), torch_distributed=True),
    MESH: Rule(
        "you are building the device mesh here: compute its coordinates and groups yourself, "
        "create each group with comm.split and average with md.all_reduce",
        functions=("minidist.parallel.mesh", "minidist.parallel.hybrid"),
        named=(("torch.distributed.device_mesh", "init_device_mesh"),),
        classes=(("minidist.parallel.mesh", "DeviceMesh", None),
                 ("minidist.parallel.hybrid", "HybridGPT", None))),
    AMP: Rule(
        "you are writing the loss scaler's schedule and its skipped step here: write them "
        "from the description, agreeing with md.all_reduce",
        classes=(("torch.amp.grad_scaler", "GradScaler", None),),
        packages=("minidist.parallel.amp",),
        torch_ops=("_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_")),
    COMM_EFFICIENCY: Rule(
        "you are writing hierarchical all_reduce and compression here: build them from "
        "comm.split, md.reduce_scatter, md.all_reduce (ring, tree, ...), md.all_gather and "
        "torch (torch.topk, torch.linalg.qr)",
        packages=("minidist.collectives.hierarchical", "minidist.compression",
                  "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"),
        optional=True, torch_distributed=True, then=_comm_efficiency_paths),
}
SPARED = {  # modules of those packages that stay: tools to check an answer, not the answer
    "minidist.parallel.pipeline.simulator",
}
TORCH_DISTRIBUTED = (  # what a rule with torch_distributed takes from torch.distributed
    "init_process_group", "new_group", "new_subgroups", "init_device_mesh", "all_reduce",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter",
    "all_reduce_coalesced", "all_gather_object", "broadcast_object_list", "send", "recv",
    "isend", "irecv", "batch_isend_irecv", "ProcessGroupGloo", "TCPStore", "FileStore",
    "HashStore", "PrefixStore")
