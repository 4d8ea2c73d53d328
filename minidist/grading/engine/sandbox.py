"""What a test puts out of the learner's reach, in the child process that runs their code.

A test names rules (``GradedTest.rules``; the table of what each refuses, and why, is
``sandbox_rules.py``): :func:`forbid` applies them in the child before the learner's code is
loaded, and :func:`guard` hardens each rank's communicator. Each rule closes a bypass at its
source, so that no import path or alias reaches around it: the code of a library function is
swapped for a refusal (every reference to it, however imported, now raises), a class's
methods are replaced, and ``torch.distributed`` cannot create a process group or run a
collective where the rule says so. :func:`seal_grading` and :func:`close_library_sources`
keep the grader's modules and the library's source files out of reach.

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

from ...comm.contexts import PAYLOAD, Ch, channel_of
from .sandbox_rules import (  # noqa: F401  (re-exported: exercises and tests import them here)
    AMP,
    BUCKETS,
    COLLECTIVES,
    COMM_EFFICIENCY,
    DATA_PARALLEL,
    FIT,
    MESH,
    NOT_ALLOWED_TEXT,
    PARAM_SERVER,
    PIPELINE,
    PREDICT,
    RULES,
    SAMPLER,
    SENDRECV,
    SPARED,
    TENSOR_PARALLEL,
    TORCH_DISTRIBUTED,
    ZERO,
    NotAllowed,
    Rule,
    message,
)

EAGER_LIMIT = 0


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


def constant(fn, value) -> None:
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
    for name in TORCH_DISTRIBUTED:
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
