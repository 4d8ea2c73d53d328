"""Hybrid (3D) parallelism: the small GPT trained over a ``DeviceMesh`` of dp x pp x tp ranks,
composing the strategies of the folders beside this file.

    mesh = md.DeviceMesh(comm, {"dp": 2, "pp": 2, "tp": 2})
    model = HybridGPT(config, mesh, microbatches=4, lr=0.1)
    loss = model.step(x, y)            # the same global batch (b, s) on every rank
    params = model.full_parameters()   # the full GPT's parameters, by name, on every rank

Each rank holds one tensor-parallel shard (``parallelize_gpt`` over ``mesh["tp"]``) of one
pipeline stage (``split_model`` of ``GPT.stages()`` over ``mesh["pp"]``) of one data-parallel
replica (``mesh["dp"]``). Per step:

1. data: the global batch is cut into dp equal slices; replica d trains on slice d. The pp
   and tp ranks of one replica read the same slice (a pipeline needs it on its first and last
   stage, tensor parallelism on every rank of its group);
2. pipeline: the slice is cut into m micro-batches and runs through the pp stages
   (``md.Schedule1F1B`` by default); inside a stage, each layer's forward and backward
   all-reduce activations over tp (Megatron's f and g); with pp = 1 the "pipeline" is one
   stage running the micro-batches one after another (gradient accumulation);
3. gradients: after the LAST micro-batch's backward (the schedule's ``after_backward``) they
   are averaged over dp only: one all-reduce of this rank's shard of this stage, so every
   gradient is synchronised once per step, not once per micro-batch. With ``zero_stage`` the
   dp dimension is ``md.ZeRO`` instead, whose ``step`` reduce-scatters, updates the shard and
   all-gathers;
4. update: each rank steps its own shard; no rank ever holds the full model.

Why this equals one process on the full batch: the loss is a mean over tokens; the schedule
scales micro-batch i's loss by n_i / N, tp's cross-entropy is the full vocabulary's, and dp
slices are equal, so the average of dp means is the global mean.

The ordering rule (PTD-P; Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC 2021, section 3 and Table 1): tp inside a node (it
all-reduces b s h activations 4 times per block per micro-batch: it needs NVLink), pp across
nodes (one b s h activation per micro-batch between neighbours), dp outermost (one gradient
all-reduce per step, overlappable). Hence the mesh ``{"dp": .., "pp": .., "tp": ..}`` with tp
last: tp neighbours are adjacent ranks. Per rank and step (``md.costmodel`` as code:
``tp.py``, ``pp.py``, ``dp.py``; ``minidist bench hybrid`` measured and predicted):
Psi / (pp tp) parameters; bubble (pp - 1) / (m + pp - 1); over tp, 4 all-reduces of b s h
elements per layer per micro-batch (2 forward, 2 backward), one more on the stage with the
embedding (forward) and on the one with the head (backward), and 3 of b s for the loss,
2 (tp - 1)/tp of each sent; over pp, one activation and one gradient of b s h per
micro-batch, whole from every tp rank (no scatter/gather); over dp, one all-reduce of the
Psi / (pp tp) gradients, 2 (dp - 1)/dp of them sent.

Limits, as in the systems this imitates: a head tied to the embedding cannot be split across
pipeline stages (use ``GPTConfig(tie_weights=False)`` when pp > 1); ZeRO stages 2 and 3 reduce
gradients inside every backward, i.e. per micro-batch, so with pp > 1 only stages 0 and 1 are
allowed (DeepSpeed refuses the same); ZeRO stage 3 frees the parameters that tensor
parallelism gathers back from, so it needs tp = 1.
"""

from __future__ import annotations

import torch
from torch import nn

from ..checks import one_of, positive_int, zero_with_pipeline
from ..checks import zero_stage as check_zero_stage
from ..collectives import all_reduce, all_reduce_coalesced, broadcast
from ..models.gpt import GPT, GPTConfig, lm_loss
from .mesh import DeviceMesh
from .pipeline import PipelineSchedule, PipelineStage, split_model
from .tensor import parallelize_gpt, vocab_parallel_cross_entropy
from .tensor.parallel_gpt import SHARDED
from .zero import ZeRO
from .zero.flat_shards import storage_bytes

DIMS = ("dp", "pp", "tp")
SCHEDULES = ("naive", "gpipe", "1f1b")


def complete_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """``mesh`` with any of dp, pp, tp it lacks added as a dimension of size 1 (at the end:
    a dimension of size 1 changes no group, so the given order is kept)."""
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be an md.DeviceMesh, got {type(mesh).__name__}")
    unknown = [n for n in mesh.names if n not in DIMS]
    if unknown:
        raise ValueError(f"HybridGPT knows the mesh dimensions {DIMS}, got {unknown} in "
                         f"{mesh.shape}")
    if all(n in mesh for n in DIMS):
        return mesh
    return DeviceMesh(mesh.comm, {**mesh.shape, **{n: 1 for n in DIMS if n not in mesh}})


def check_options(config: GPTConfig, mesh: DeviceMesh, microbatches: int, schedule: str,
                  zero_stage: int | None) -> None:
    """A clear error for a layout this module cannot train."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be an md.models.GPTConfig, got {type(config).__name__}")
    positive_int(microbatches, "microbatches")
    one_of(schedule, SCHEDULES, "schedule")
    pp, tp = mesh.size("pp"), mesh.size("tp")
    if pp > 1 and config.tie_weights:
        raise ValueError(f"pp={pp}: a head tied to the embedding cannot be split across "
                         "pipeline stages; use GPTConfig(tie_weights=False)")
    if pp > config.n_layer + 2:
        raise ValueError(f"pp={pp} stages but the GPT has only {config.n_layer + 2} layers "
                         "(embedding, blocks, head) to split")
    if check_zero_stage(zero_stage, "zero_stage", optional=True) is not None:
        zero_with_pipeline(zero_stage, pp)
    if zero_stage == 3 and tp > 1:
        raise ValueError(f"zero_stage=3 with tp={tp}: stage 3 frees the sharded layers' "
                         "parameters between steps; use zero_stage 1 or 2 with tensor "
                         "parallelism")


def build_stage(config: GPTConfig, mesh: DeviceMesh, dtype: torch.dtype, algorithm: str):
    """This rank's layers (``nn.Sequential``): its pp stage of the GPT, tp-sharded. Also the
    full model's parameter names of the layers' parameters, and every full shape."""
    # the same weights on every rank (seeded on the CPU), then on the mesh's device
    gpt = GPT(config).to(dtype=dtype, device=mesh.comm.device)
    shapes = {name: p.shape for name, p in gpt.named_parameters()}
    tp = mesh["tp"]
    model = parallelize_gpt(gpt, tp, algorithm).model if tp.world_size > 1 else gpt
    names = {id(p): name for name, p in model.named_parameters()}
    pp = mesh.size("pp")
    layers = split_model(model, pp)[mesh.coords["pp"]] if pp > 1 else \
        nn.Sequential(*model.stages())
    held = {id(p) for p in layers.parameters()}
    return layers, {i: n for i, n in names.items() if i in held}, shapes


def make_loss(mesh: DeviceMesh, algorithm: str):
    """The loss of the last stage's output: vocabulary-parallel cross-entropy over tp."""
    tp = mesh["tp"]
    if tp.world_size == 1:
        return lm_loss
    return lambda logits, targets: vocab_parallel_cross_entropy(logits, targets, tp,
                                                                algorithm=algorithm)


def average_gradients(dp, params: list[nn.Parameter], algorithm: str = "auto") -> None:
    """Plain data parallelism: average every gradient over dp in one coalesced all-reduce
    of 2 (dp - 1)/dp x this rank's bytes (a missing gradient counts as zero)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    all_reduce_coalesced(dp, [p.grad for p in params], op="avg", algorithm=algorithm)


class HybridGPT:
    """The small GPT trained over ``mesh`` (dimensions among dp, pp, tp; see the module
    docstring). ``microbatches`` per step and ``schedule`` ("1f1b", "gpipe", "naive") for
    the pipeline; ``zero_stage`` (None: plain data parallelism) makes the dp dimension
    ``md.ZeRO``; ``optimizer_class(**optimizer_kwargs)`` steps this rank's parameters;
    ``dtype`` of the model; ``algorithm``: the all-reduce of tp and of plain dp
    (``md.ALL_REDUCE_ALGORITHMS``). The layers live on ``mesh.comm.device`` (a CUDA
    launch: the GPU; the batch is moved there). Collective: build it on every rank of
    ``mesh``."""

    def __init__(self, config: GPTConfig, mesh: DeviceMesh, microbatches: int = 1,
                 schedule: str = "1f1b", zero_stage: int | None = None,
                 optimizer_class: type = torch.optim.SGD, dtype: torch.dtype = torch.float32,
                 algorithm: str = "auto", **optimizer_kwargs):
        self.mesh = complete_mesh(mesh)
        check_options(config, self.mesh, microbatches, schedule, zero_stage)
        self.config, self.microbatches, self.zero_stage = config, microbatches, zero_stage
        self.algorithm = algorithm
        self.layers, self.names, self.shapes = build_stage(config, self.mesh, dtype, algorithm)
        self.params = list(self.layers.parameters())
        if zero_stage is None:
            self.zero, self.optimizer = None, optimizer_class(self.params, **optimizer_kwargs)
            module, sync = self.layers, self._average_gradients
        else:
            self.zero = ZeRO(self.layers, self.mesh["dp"], zero_stage, optimizer_class,
                             **optimizer_kwargs)
            self.optimizer = self.zero.optimizer
            module, sync = self.zero, None  # ZeRO.step averages the gradients itself
        self.updater = self.zero if self.zero is not None else self.optimizer  # zero_grad, step
        self.stage = PipelineStage(module, self.mesh["pp"])
        self.schedule = PipelineSchedule(self.stage, microbatches,
                                         make_loss(self.mesh, algorithm),
                                         schedule=schedule, after_backward=sync)

    def _average_gradients(self, _stage) -> None:
        """The schedule's ``after_backward``: runs once, after the last micro-batch."""
        average_gradients(self.mesh["dp"], self.params, self.algorithm)

    def _my_slice(self, t: torch.Tensor, what: str) -> torch.Tensor:
        """This replica's dp slice of the global batch (pp and tp ranks read the same)."""
        dp, d = self.mesh.size("dp"), self.mesh.coords["dp"]
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] % dp:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{what} must be a tensor whose batch size (dim 0) divides into "
                             f"dp={dp} equal slices, got {shape}")
        return t.tensor_split(dp)[d].to(self.params[0].device)  # the batch may be on the CPU

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One training step on the global batch ``(x, y)``; returns its mean loss (the
        same float on every rank). Collective over the whole mesh."""
        x, y = self._my_slice(x, "x"), self._my_slice(y, "y")
        self.updater.zero_grad()  # here, not after step: memory() sees the gradients
        losses: list[torch.Tensor] = []
        args = (x,) if self.stage.is_first else ()
        target = y if self.stage.is_last else None
        self.schedule.step(*args, target=target, losses=losses)
        self.updater.step()
        return self._mean_loss(losses, y)

    def _mean_loss(self, losses: list[torch.Tensor], y: torch.Tensor) -> float:
        """The step's loss: micro-batch losses weighted by size on the last stage, sent to
        every stage, averaged over dp (equal slices)."""
        t = torch.zeros(1, dtype=torch.float64, device=self.params[0].device)  # NCCL: CUDA only
        if self.stage.is_last:
            sizes = [len(c) for c in torch.tensor_split(y, self.microbatches)]
            t[0] = sum(float(loss) * n for loss, n in zip(losses, sizes)) / len(y)
        broadcast(self.mesh["pp"], t, src=self.mesh.size("pp") - 1)
        return float(all_reduce(self.mesh["dp"], t, op="avg"))

    def _local_values(self) -> list[torch.Tensor]:
        """This rank's parameters (ZeRO stage 3: gathered over dp), in ``params`` order."""
        if self.zero is not None and self.zero_stage == 3:
            return self.zero.full_parameters()
        return [p.detach() for p in self.params]

    def _gathered_over_tp(self) -> dict[str, torch.Tensor]:
        """This stage's parameters, each gathered to its full shape, by full-model name."""
        values = {id(p): v for p, v in zip(self.params, self._local_values())}
        out: dict[str, torch.Tensor] = {}
        for module in self.layers.modules():
            for kind, p in module.named_parameters(recurse=False):
                name = self.names[id(p)]
                if name in out:
                    continue  # a tied weight, listed once
                if isinstance(module, SHARDED):
                    out[name] = module.full_weight() if kind == "weight" else module.full_bias()
                else:
                    out[name] = values[id(p)].clone()
        return out

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter of the full GPT, by name in ``GPT.named_parameters()`` order, on
        every rank: gathered over tp, then summed over pp (each stage adds the parameters it
        holds, zeros for the rest). Collective over the whole mesh."""
        mine = self._gathered_over_tp()
        dtype, device = self.params[0].dtype, self.params[0].device
        out = {}
        for name, shape in self.shapes.items():
            t = mine[name] if name in mine else torch.zeros(shape, dtype=dtype, device=device)
            out[name] = all_reduce(self.mesh["pp"], t.contiguous(), op="sum")
        return out

    def memory(self) -> dict[str, int]:
        """This rank's bytes of parameters, gradients and optimizer state, measured from the
        storages held (ZeRO's own count when the dp dimension is ZeRO)."""
        if self.zero is not None:
            return self.zero.memory()
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        out = {"params": storage_bytes(self.params),
               "grads": storage_bytes(p.grad for p in self.params),
               "optimizer": storage_bytes(state)}
        out["total"] = sum(out.values())
        return out

    def __repr__(self) -> str:
        return (f"HybridGPT({self.mesh.shape}, microbatches={self.microbatches}, "
                f"zero_stage={self.zero_stage}, rank {self.mesh.comm.rank} at "
                f"{self.mesh.coords})")
