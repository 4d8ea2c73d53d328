"""What a test puts out of the learner's reach, in the child process that runs their code.

A test names rules (``GradedTest.rules``); :func:`forbid` applies them in the child before
the learner's code is loaded, and :func:`guard` hardens each rank's communicator. Each rule
closes a bypass at its source, so that no import path or alias reaches around it:

- ``COLLECTIVES``: the rank's transport refuses the collectives' context (the one
  ``comm.collective`` talks on, which every minidist collective uses to move data) and the
  shared-memory and process-group capabilities; the code of every minidist collective
  function is replaced by one that raises; ``torch.distributed`` cannot create a process
  group or run a collective.
- ``SENDRECV``: ``comm.sendrecv`` raises (and a rank's timeline shows any call that got past).
- ``SAMPLER``, ``BUCKETS``, ``FIT``, ``PREDICT``: minidist's and torch's own implementation
  of what the exercise builds raises.
- ``DATA_PARALLEL``: every method of minidist's data-parallel machinery (DDP, the naive
  wrapper, the bucket scheduler and its communication thread, buckets, reductions),
  ``all_reduce_coalesced`` and torch's DDP raise, and ``torch.distributed`` cannot create a
  process group; ``md.all_reduce`` stays: it is what the learner builds on.
- ``PARAM_SERVER``: every method of ``md.ParameterServer``, its server and its worker, and
  the consistency rules of ``minidist.parallel.param_server.rules`` raise.
- ``TENSOR_PARALLEL``: every function and every method of every class in
  ``minidist.parallel.tensor`` (Megatron's operators, parallel layers, cross-entropy, the
  GPT) raises, and ``torch.distributed`` cannot create a process group (so neither can
  ``torch.distributed.tensor.parallel``); ``md.all_reduce`` stays.
- ``PIPELINE``: every function and method of ``md.pipeline``'s schedules and runtime
  raises; the simulator (``md.pipeline.simulate``) stays, to check a schedule.
- ``ZERO``: every function and method of ``minidist.parallel.zero`` (``md.ZeRO``, its flat
  shards, gradient buckets and parameter units) and torch's ``ZeroRedundancyOptimizer``
  raise, and ``torch.distributed`` cannot create a process group (so neither can
  ``fully_shard``); ``md.reduce_scatter``, ``md.all_gather`` and ``md.reduce`` stay.
- ``MESH``: every function of ``minidist.parallel.mesh`` and ``minidist.parallel.hybrid``
  and every method of ``md.DeviceMesh`` and ``HybridGPT`` raise, and so does torch's
  ``init_device_mesh``; ``comm.split`` and ``md.all_reduce`` stay: they are what the
  learner builds on.
- ``AMP``: every function and method of ``minidist.parallel.amp`` (``md.GradScaler``, the
  master-weight wrapper, its helpers), every method of ``torch.amp.GradScaler`` (so also its
  CUDA and sharded subclasses) and torch's fused ``_amp_update_scale_`` and
  ``_amp_foreach_non_finite_check_and_unscale_`` raise; ``md.all_reduce`` stays.

Every refusal raises :class:`NotAllowed`, whose message says what is not allowed and why.
Every rank also sends with ``comm.eager_limit = 0``: a send waits for its receive, as a large
message does on a real cluster, so a program that only works because sends are buffered
deadlocks here as it would there. :func:`observe` lets a test watch every call of a library
function the learner may use (``md.all_reduce``), however it was imported.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types

COLLECTIVES, SENDRECV, SAMPLER = "collectives", "sendrecv", "sampler"
BUCKETS, DATA_PARALLEL, FIT, PREDICT = "buckets", "data_parallel", "fit", "predict"
PARAM_SERVER = "param_server"
TENSOR_PARALLEL = "tensor_parallel"
PIPELINE = "pipeline"
ZERO = "zero"
MESH = "mesh"
AMP = "amp"
EAGER_LIMIT = 0
NOT_ALLOWED_TEXT = "is not allowed in this exercise"

WHY = {
    COLLECTIVES: "you are building a collective from point-to-point messages here: use "
                 "comm.send, comm.recv, comm.isend and comm.irecv",
    SENDRECV: "order comm.send and comm.recv yourself (or post comm.irecv first)",
    SAMPLER: "shard_indices is the sampler's own logic: write it from the description",
    BUCKETS: "assign_buckets is DDP's own rule: write it from the description",
    DATA_PARALLEL: "you are building data parallelism's mechanism here: register the hooks "
                   "and call md.all_reduce yourself",
    FIT: "write the least-squares fit yourself (np.linalg.lstsq)",
    PREDICT: "write the alpha-beta formula yourself",
    PARAM_SERVER: "you are building the parameter server's loop and rules here: use "
                  "comm.send and comm.recv",
    TENSOR_PARALLEL: "you are building Megatron's operators and parallel layers here: "
                     "write them with md.all_reduce and torch.autograd.Function",
    PIPELINE: "you are writing the 1F1B schedule and a stage's messages here: write them "
              "from the description (md.pipeline.simulate stays, to check your lists)",
    ZERO: "you are writing ZeRO's sharded step here: build it from md.reduce_scatter (or "
          "md.all_reduce), md.reduce and md.all_gather",
    MESH: "you are building the device mesh here: compute its coordinates and groups "
          "yourself, create each group with comm.split and average with md.all_reduce",
    AMP: "you are writing the loss scaler's schedule and its skipped step here: write "
         "them from the description, agreeing with md.all_reduce",
}
_LIBRARY_PACKAGES = {  # rule -> packages whose every function and class method is disabled
    TENSOR_PARALLEL: ("minidist.parallel.tensor",),
    PIPELINE: ("minidist.parallel.pipeline",),
    ZERO: ("minidist.parallel.zero",),
    AMP: ("minidist.parallel.amp",),
}
_SPARED = {  # modules of those packages that stay: tools to check an answer, not the answer
    "minidist.parallel.pipeline.simulator",
}
_LIBRARY_FUNCTIONS = {  # rule -> modules whose every function is disabled
    COLLECTIVES: ("minidist.collectives.api", "minidist.collectives.allreduce",
                  "minidist.collectives.rooted", "minidist.collectives.shared_memory",
                  "minidist.collectives.auto"),
    PARAM_SERVER: ("minidist.parallel.param_server.rules",),
    MESH: ("minidist.parallel.mesh", "minidist.parallel.hybrid"),
}
_NAMED_FUNCTIONS = {  # rule -> (module, function)
    SAMPLER: (("minidist.parallel.data.sampler", "shard_indices"),),
    BUCKETS: (("minidist.parallel.data.buckets", "assign_buckets"),),
    FIT: (("minidist.bench.p2p", "fit_alpha_beta"),),
    PREDICT: (("minidist.collectives.costs", "time"),),
    DATA_PARALLEL: (("minidist.collectives.api", "all_reduce_coalesced"),
                    ("minidist.parallel.data.buckets", "assign_buckets"),
                    ("minidist.parallel.data.buckets", "allreduce_hook")),
    MESH: (("torch.distributed.device_mesh", "init_device_mesh"),),
}
_DATA = "minidist.parallel.data."
_CLASSES = {  # rule -> (module, class, methods; None: every function the class defines)
    SAMPLER: (("torch.utils.data.distributed", "DistributedSampler", ("__init__", "__iter__")),
              ("minidist.parallel.data.sampler", "DistributedSampler", ("__init__", "__iter__"))),
    DATA_PARALLEL: ((_DATA + "ddp", "DistributedDataParallel", None),
                    (_DATA + "naive", "DataParallelNaive", None),
                    (_DATA + "scheduler", "BucketScheduler", None),
                    (_DATA + "scheduler", "CommThread", None),
                    (_DATA + "buckets", "Bucket", None),
                    (_DATA + "reductions", "Average", None),
                    (_DATA + "reductions", "CommHook", None),
                    ("torch.nn.parallel", "DistributedDataParallel", ("__init__",))),
    PARAM_SERVER: (("minidist.parallel.param_server.parameter_server", "ParameterServer", None),
                   ("minidist.parallel.param_server.server", "ShardServer", None),
                   ("minidist.parallel.param_server.worker", "WorkerClient", None)),
    MESH: (("minidist.parallel.mesh", "DeviceMesh", None),
           ("minidist.parallel.hybrid", "HybridGPT", None)),
    ZERO: (("torch.distributed.optim.zero_redundancy_optimizer", "ZeroRedundancyOptimizer",
            ("__init__", "step")),),
    AMP: (("torch.amp.grad_scaler", "GradScaler", None),),
    PREDICT: (("minidist.transports.network", "Link", ("time",)),
              ("minidist.collectives.costs", "Terms", ("time",))),
}
_TORCH_OPS = {  # rule -> torch's built-in operators (not Python code: replaced, not rewritten)
    AMP: ("_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_"),
}
_TORCH_DISTRIBUTED = (
    "init_process_group", "new_group", "new_subgroups", "init_device_mesh", "all_reduce",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter",
    "all_reduce_coalesced", "all_gather_object", "broadcast_object_list", "send", "recv",
    "isend", "irecv", "batch_isend_irecv", "ProcessGroupGloo", "TCPStore", "FileStore",
    "HashStore", "PrefixStore")


class NotAllowed(RuntimeError):
    """The learner's code called what the exercise asks them to build."""


def message(what: str, rule: str) -> str:
    return f"{what} {NOT_ALLOWED_TEXT}: {WHY[rule]}"


def forbid(rules) -> None:
    """Apply ``rules`` to this (child) process: library functions and classes raise."""
    for rule in rules:
        for module in _LIBRARY_FUNCTIONS.get(rule, ()):
            _disable_module_functions(module, rule)
        for module, name in _NAMED_FUNCTIONS.get(rule, ()):
            mod = importlib.import_module(module)
            _disable_function(getattr(mod, name), message(f"{module}.{name}", rule))
        for module, name, methods in _CLASSES.get(rule, ()):
            cls = getattr(importlib.import_module(module), name)
            if methods is None:
                methods = [k for k, v in vars(cls).items() if isinstance(v, types.FunctionType)]
            for method in methods:
                setattr(cls, method, _refusal(message(f"{module}.{name}", rule)))
        for package in _LIBRARY_PACKAGES.get(rule, ()):
            _disable_package(package, rule)
        for name in _TORCH_OPS.get(rule, ()):
            setattr(importlib.import_module("torch"), name,
                    _refusal(message(f"torch.{name}", rule)))
        if rule == COMM_EFFICIENCY:
            _forbid_comm_efficiency()
    torch_rule = next((r for r in (COLLECTIVES, DATA_PARALLEL, TENSOR_PARALLEL, ZERO)
                       if r in rules),
                      None)
    if torch_rule is not None:
        _forbid_torch_distributed(torch_rule)


def _disable_package(package: str, rule: str) -> None:
    """Every function, and every method of every class, defined in ``package``'s modules."""
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
    for name in [n for n in names if n not in _SPARED]:
        _disable_module_functions(name, rule)
        for cls in [v for v in vars(sys.modules[name]).values()
                    if isinstance(v, type) and v.__module__ == name]:
            text = message(f"{name}.{cls.__name__}", rule)
            for key, value in list(vars(cls).items()):
                if isinstance(value, types.FunctionType):
                    setattr(cls, key, _refusal(text))
                elif isinstance(value, (staticmethod, classmethod)):
                    setattr(cls, key, type(value)(_refusal(text)))


def _disable_module_functions(module: str, rule: str) -> None:
    mod = importlib.import_module(module)
    for name, value in vars(mod).items():
        if callable(value) and getattr(value, "__module__", None) == module and \
                hasattr(value, "__code__"):
            _disable_function(value, message(f"{module}.{name}", rule))


def _disable_function(fn, text: str) -> None:
    """Replace ``fn``'s code, so that every reference to it (however imported) raises."""
    if fn.__code__.co_freevars:  # a closure: its code cannot be swapped; hide nothing less
        return
    source = f"def refused(*args, **kwargs):\n    raise RuntimeError({text!r})\n"
    namespace: dict = {}
    exec(compile(source, "<not allowed>", "exec"), {}, namespace)
    fn.__code__ = namespace["refused"].__code__


def _refusal(text: str):
    def refused(*args, **kwargs):
        raise NotAllowed(text)
    return refused


def _forbid_torch_distributed(rule: str) -> None:
    import torch.distributed
    import torch.distributed.distributed_c10d

    modules = [torch.distributed, torch.distributed.distributed_c10d,
               sys.modules.get("torch._C._distributed_c10d")]
    for name in _TORCH_DISTRIBUTED:
        refusal = _refusal(message(f"torch.distributed.{name}", rule))
        for module in modules:
            if module is not None and hasattr(module, name):
                setattr(module, name, refusal)


# -- exercise 09: communication efficiency (its rule, in one place) ------------------------------
COMM_EFFICIENCY = "comm_efficiency"
WHY[COMM_EFFICIENCY] = ("you are writing hierarchical all_reduce and compression here: build "
                        "them from comm.split, md.reduce_scatter, md.all_reduce (ring, tree, "
                        "...), md.all_gather and torch (torch.topk, torch.linalg.qr)")
_COMM_EFFICIENCY_CODE = ("minidist.collectives.hierarchical", "minidist.compression",
                         "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook")


def _forbid_comm_efficiency() -> None:
    """``COMM_EFFICIENCY``: ``md.all_reduce(..., algorithm="hierarchical")`` raises, and so
    does every function and class method of the library's hierarchical all_reduce, of
    ``minidist.compression`` (``TopK``, ``PowerSGD``, the casting hooks) and of torch's
    PowerSGD hook: whichever of those modules exist (one that is missing or does not import
    is skipped). ``torch.distributed`` cannot create a process group. The shared-memory
    all_reduce is off, so every byte a collective moves is a message the test counts."""
    from ..collectives import api, shared_memory

    for root in _COMM_EFFICIENCY_CODE:
        try:
            mod = importlib.import_module(root)
        except Exception:  # not written yet, or mid-edit: nothing there to reach
            continue
        subs = pkgutil.walk_packages(mod.__path__, root + ".") if hasattr(mod, "__path__") \
            else ()
        for name in [root] + [m.name for m in subs]:
            try:
                importlib.import_module(name)
            except Exception:
                continue
            _disable_module_functions(name, COMM_EFFICIENCY)
            for cls in [v for v in vars(sys.modules[name]).values()
                        if isinstance(v, type) and v.__module__ == name]:
                for key, value in list(vars(cls).items()):
                    if isinstance(value, types.FunctionType):
                        setattr(cls, key, _refusal(message(f"{name}.{cls.__name__}",
                                                           COMM_EFFICIENCY)))

    def no_hierarchical(original, comm, t, *args, **kwargs):
        if "hierarchical" in (*args[1:2], kwargs.get("algorithm")):
            raise NotAllowed(message('md.all_reduce(..., algorithm="hierarchical")',
                                     COMM_EFFICIENCY))
        return original(comm, t, *args, **kwargs)

    observe(api.all_reduce, no_hierarchical)
    observe(shared_memory.available, lambda original, *args, **kwargs: False)
    _forbid_torch_distributed(COMM_EFFICIENCY)


_OBSERVED = "__minidist_grader_observed__"


def observe(fn, around) -> None:
    """From now on, in this process, every call of ``fn`` (however it was imported: its code
    is swapped, as a refusal's is) runs ``around(original, *args, **kwargs)``, which may
    record the call and must call ``original(*args, **kwargs)`` itself. Calling again
    replaces ``around``."""
    table = fn.__globals__.setdefault(_OBSERVED, {})
    name = fn.__name__
    if name not in table:
        original = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__,
                                      fn.__closure__)
        original.__kwdefaults__ = fn.__kwdefaults__
        source = (f"def {name}(*args, **kwargs):\n    original, around = {_OBSERVED}[{name!r}]\n"
                  "    return around(original, *args, **kwargs)\n")
        namespace: dict = {}
        exec(compile(source, "<observed>", "exec"), {}, namespace)
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = namespace[name].__code__, None, None
        table[name] = (original, around)
    table[name] = (table[name][0], around)


class _SealedGrading:
    """A meta path finder: the grader's modules cannot be imported (again) here."""

    def find_spec(self, name, path=None, target=None):
        if name == "minidist.grading" or name.startswith("minidist.grading."):
            raise ImportError(f"{name} is not available to the code under test: the grader's "
                              "tests and their data stay out of its reach")
        return None


def seal_grading() -> None:
    """In the child, before the learner's code loads: ``import minidist.grading...`` fails
    (the grader's own code, already loaded, keeps working), so the tests' modules, their
    data and their answers cannot be read or patched from the learner's code."""
    import minidist

    for name in [n for n in sys.modules if n == "minidist.grading" or
                 n.startswith("minidist.grading.")]:
        del sys.modules[name]
    if "grading" in vars(minidist):
        delattr(minidist, "grading")
    sys.meta_path.insert(0, _SealedGrading())


# -- a rank's communicator ---------------------------------------------------------------------
class GuardedTransport:
    """A rank's transport as the grader lets the learner's communicator use it: counts what
    goes out on the counted contexts (user and collectives: the bytes a test checks, whatever
    ``comm.stats`` says) and payload on the library's control context; refuses the
    collectives' context where the rules say so."""

    def __init__(self, inner, refuse_collectives: bool):
        self._inner, self._refuse = inner, refuse_collectives
        self.reset()

    def reset(self) -> None:
        self.sent: dict[int, int] = {}
        self.messages: dict[int, int] = {}
        self.hidden = 0  # payload bytes sent on a control context

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _check(self, ctx: int) -> None:
        if self._refuse and ctx % 4 == 2:
            raise NotAllowed(message("minidist's collectives (md.all_reduce, "
                                     "minidist.collectives.*, comm.collective)", COLLECTIVES))

    def isend(self, tensor, dst, ctx, tag, code):
        self._check(ctx)
        nbytes = tensor.numel() * tensor.element_size()
        if ctx % 4 in (0, 2):
            self.sent[dst] = self.sent.get(dst, 0) + nbytes
            self.messages[dst] = self.messages.get(dst, 0) + 1
        elif ctx % 4 == 1:
            self.hidden += nbytes
        return self._inner.isend(tensor, dst, ctx, tag, code)

    def irecv(self, tensor, src, ctx, tag, code):
        self._check(ctx)
        return self._inner.irecv(tensor, src, ctx, tag, code)

    def capability(self, name: str):
        if self._refuse:
            raise NotAllowed(message(f"the transport's {name!r} capability", COLLECTIVES))
        return self._inner.capability(name)


def guard(comm, rules) -> GuardedTransport:
    """Harden a rank's communicator for a test; return the transport that counts."""
    transport = comm.wrap_transport(lambda inner: GuardedTransport(inner, COLLECTIVES in rules))
    comm.eager_limit = EAGER_LIMIT
    comm.timeline.enable()
    if SENDRECV in rules:
        comm.sendrecv = _refusal(message("comm.sendrecv", SENDRECV))
    return transport
