"""What a test puts out of the learner's reach, in the child process that runs their code.

A test names rules (``GradedTest.rules``); :func:`forbid` applies them in the child before
the learner's code is loaded, and :func:`guard` hardens each rank's communicator. Each rule
is one row of :data:`RULES` and closes a bypass at its source, so that no import path or
alias reaches around it: the code of a library function is swapped for a refusal (every
reference to it, however imported, now raises), a class's methods are replaced, and
``torch.distributed`` cannot create a process group or run a collective where the rule says
so. What the learner builds on stays (``md.all_reduce`` under ``DATA_PARALLEL``, ``comm.split``
under ``MESH``, the pipeline simulator under ``PIPELINE``): each rule's ``why`` names it.

- ``COLLECTIVES`` also makes the rank's transport refuse the collectives' context (the one
  ``comm.collective`` talks on) and every capability (``guard``): the learner's bytes all go
  through point-to-point calls.
- ``SENDRECV``: ``comm.sendrecv`` raises (and a rank's timeline shows any call that got past).
- ``COMM_EFFICIENCY`` also refuses ``md.all_reduce(..., algorithm="hierarchical")`` and turns
  the shared-memory all_reduce off, so that every byte a collective moves is a message; the
  modules it names may be missing (not written yet): those are skipped.

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
from collections.abc import Callable
from dataclasses import dataclass

from ...comm.contexts import PAYLOAD, Ch, channel_of

COLLECTIVES, SENDRECV, SAMPLER = "collectives", "sendrecv", "sampler"
BUCKETS, DATA_PARALLEL, FIT, PREDICT = "buckets", "data_parallel", "fit", "predict"
PARAM_SERVER, TENSOR_PARALLEL, PIPELINE = "param_server", "tensor_parallel", "pipeline"
ZERO, MESH, AMP, COMM_EFFICIENCY = "zero", "mesh", "amp", "comm_efficiency"
EAGER_LIMIT = 0
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


_OBSERVED = "__minidist_grader_observed__"


def observe(fn, around) -> None:
    """From now on, in this process, every call of ``fn`` (however it was imported: its code
    is swapped, as a refusal's is) runs ``around(original, *args, **kwargs)``, which may
    record the call and must call ``original(*args, **kwargs)`` itself. Calling again
    replaces ``around``."""
    fn = unwrapped(fn)
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


def _constant(fn, value) -> None:
    """``fn`` returns ``value`` from now on, in this process; its own code is dropped."""
    fn = unwrapped(fn)
    namespace: dict = {}
    exec(compile(f"def {fn.__name__}(*args, **kwargs):\n    return {value!r}\n", "<rule>",
                 "exec"), {}, namespace)
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = namespace[fn.__name__].__code__, None, None


def unwrapped(fn):
    """The function whose code to swap: ``fn``, or for a decorated one (a closure made by
    ``functools.wraps``, whose code cannot be swapped) the function it wraps, so that the
    decorator's wrapper still runs and then reaches the swapped code."""
    while fn.__code__.co_freevars and callable(getattr(fn, "__wrapped__", None)):
        fn = fn.__wrapped__
    return fn


def _comm_efficiency_paths() -> None:
    """``COMM_EFFICIENCY``'s refusal of the hierarchical path inside ``md.all_reduce`` and
    its shared-memory path off (see the module docstring)."""
    from ...collectives import api, shared_memory

    def no_hierarchical(original, comm, t, *args, **kwargs):
        if "hierarchical" in (*args[1:2], kwargs.get("algorithm")):
            raise NotAllowed(message('md.all_reduce(..., algorithm="hierarchical")',
                                     COMM_EFFICIENCY))
        return original(comm, t, *args, **kwargs)

    observe(api.all_reduce, no_hierarchical)
    # not observed: an observed function's original stays reachable from the learner's code
    # (the wrapper's globals); this one's code is replaced and nothing keeps the old one
    _constant(shared_memory.available, False)


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
_TORCH_DISTRIBUTED = (
    "init_process_group", "new_group", "new_subgroups", "init_device_mesh", "all_reduce",
    "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter",
    "all_reduce_coalesced", "all_gather_object", "broadcast_object_list", "send", "recv",
    "isend", "irecv", "batch_isend_irecv", "ProcessGroupGloo", "TCPStore", "FileStore",
    "HashStore", "PrefixStore")
_NOT_ALLOWED_NAME = "__minidist_grader_not_allowed__"  # in a refused function's globals


def forbid(rules) -> None:
    """Apply ``rules`` to this (child) process: library functions and classes raise. The
    first of them that refuses ``torch.distributed`` names that refusal."""
    for name in rules:
        _apply(name, RULES[name])
    torch_rule = next((r for r in rules if RULES[r].torch_distributed), None)
    if torch_rule is not None:
        _forbid_torch_distributed(torch_rule)


def _apply(name: str, rule: Rule) -> None:
    for module in rule.functions:
        _disable_module_functions(module, name)
    for module, function in rule.named:
        mod = importlib.import_module(module)
        _disable_function(getattr(mod, function), message(f"{module}.{function}", name))
    for module, cls_name, methods in rule.classes:
        cls = getattr(importlib.import_module(module), cls_name)
        if methods is None:
            methods = [k for k, v in vars(cls).items() if isinstance(v, types.FunctionType)]
        for method in methods:
            setattr(cls, method, _refusal(message(f"{module}.{cls_name}", name)))
    for package in rule.packages:
        _disable_package(package, name, rule.optional)
    torch = importlib.import_module("torch")
    for op in rule.torch_ops:
        setattr(torch, op, _refusal(message(f"torch.{op}", name)))
    if rule.then is not None:
        rule.then()


def _disable_package(package: str, rule: str, optional: bool) -> None:
    """Every function, and every method of every class, defined in ``package`` (a module, or
    a package and its submodules)."""
    try:
        root = importlib.import_module(package)
    except Exception:
        if not optional:
            raise
        return  # not written yet, or mid-edit: nothing there to reach
    names = [package] + ([m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
                         if hasattr(root, "__path__") else [])
    for name in [n for n in names if n not in SPARED]:
        try:
            importlib.import_module(name)
        except Exception:
            if not optional:
                raise
            continue
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
    for name, value in list(vars(mod).items()):
        if callable(value) and getattr(value, "__module__", None) == module and \
                hasattr(value, "__code__"):
            _disable_function(value, message(f"{module}.{name}", rule))


def _disable_function(fn, text: str) -> None:
    """Replace ``fn``'s code, so that every reference to it (however imported) raises
    ``NotAllowed`` (reached through a name of the grader's own in ``fn``'s module)."""
    fn = unwrapped(fn)
    if fn.__code__.co_freevars:  # a closure: its code cannot be swapped; hide nothing less
        return
    fn.__globals__[_NOT_ALLOWED_NAME] = NotAllowed
    source = f"def refused(*args, **kwargs):\n    raise {_NOT_ALLOWED_NAME}({text!r})\n"
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


_PROGRAMS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
             "pty.spawn")
_LIBRARY_TEXT = "the library's source files are not readable by the code under test"


def close_library_sources() -> None:
    """In a fresh child (``fresh.py``), once the library is loaded: from now on no code in
    this process opens a source or bytecode file of minidist (so no answer execs a switched
    off module's text into a namespace of its own: the rules stay in force), and none starts
    a program (a shell could read them). An audit hook (PEP 578): it cannot be removed."""
    import os

    import minidist

    root = os.path.dirname(os.path.realpath(minidist.__file__)) + os.sep

    def hook(event: str, args) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            if path.endswith((".py", ".pyc")) and \
                    os.path.realpath(path).startswith(root):
                raise PermissionError(f"{path}: {_LIBRARY_TEXT} {NOT_ALLOWED_TEXT}")
        elif event in _PROGRAMS:
            raise PermissionError(f"starting a program ({event}) {NOT_ALLOWED_TEXT}: the "
                                  "test runs your functions, nothing else")

    sys.addaudithook(hook)


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
        if self._refuse and channel_of(ctx) == Ch.COLLECTIVE:
            raise NotAllowed(message("minidist's collectives (md.all_reduce, "
                                     "minidist.collectives.*, comm.collective)", COLLECTIVES))

    def isend(self, tensor, dst, ctx, tag, code):
        self._check(ctx)
        nbytes = tensor.numel() * tensor.element_size()
        if channel_of(ctx) in PAYLOAD:
            self.sent[dst] = self.sent.get(dst, 0) + nbytes
            self.messages[dst] = self.messages.get(dst, 0) + 1
        elif channel_of(ctx) == Ch.CONTROL:
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
