"""A training plan: how a model is split over GPUs and how each GPU runs its share.

dp x pp x tp GPUs (data, pipeline, tensor parallel: the PTD-P of Narayanan et al., SC 2021),
the data-parallel dimension optionally sharded by ZeRO (stage 0-3; Rajbhandari et al., SC
2020), each pipeline fed ``microbatches`` micro-batches of ``micro_batch_size`` sequences
per step (so the global batch is dp x microbatches x micro_batch_size), ``chunks`` model
chunks per pipeline stage (1: 1F1B; more: the interleaved schedule), a ``precision`` for
parameters, gradients and activations (bf16 and fp16 mean mixed precision with fp32 master
weights in the optimizer), activation ``recompute`` ("none", "selective", "full";
Korthikanti et al. 2022) and ``sequence_parallel`` (the same paper: LayerNorm and dropout
split along the sequence over the tp ranks), and ``scatter_gather``: whether a pipeline
stage sends each tp rank's 1/tp slice of an activation and all-gathers it on arrival
(Megatron-LM's optimization, Narayanan et al. section 4.1; the default) or every tp rank the
whole tensor (as ``parallel.hybrid.HybridGPT`` does; ``pp.py``).

``check(model, cluster)`` says what makes a plan impossible, naming the mistake.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import one_of, positive_int, zero_stage, zero_with_pipeline
from .cluster import Cluster, check_precision
from .transformer import RECOMPUTE, GPTShape


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    microbatches: int = 1
    micro_batch_size: int = 1
    zero_stage: int = 0
    precision: str = "bf16"
    recompute: str = "none"
    sequence_parallel: bool = False
    chunks: int = 1
    scatter_gather: bool = True

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "microbatches", "micro_batch_size", "chunks"):
            positive_int(getattr(self, name), f"Plan {name}")
        zero_stage(self.zero_stage, "Plan zero_stage")
        check_precision(self.precision)
        one_of(self.recompute, RECOMPUTE, "Plan recompute")
        for name in ("sequence_parallel", "scatter_gather"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Plan {name} must be a bool, got {getattr(self, name)!r}")
        zero_with_pipeline(self.zero_stage, self.pp, "Plan zero_stage")
        if self.chunks > 1 and (self.pp == 1 or self.microbatches % self.pp):
            raise ValueError(f"Plan chunks={self.chunks} (interleaved 1F1B) needs pp > 1 and "
                             f"microbatches divisible by pp (Megatron-LM's rule); got "
                             f"pp={self.pp}, microbatches={self.microbatches}")

    @property
    def gpus(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def global_batch(self) -> int:
        """Sequences per step over all replicas: dp x microbatches x micro_batch_size."""
        return self.dp * self.microbatches * self.micro_batch_size

    def check(self, model: GPTShape, cluster: Cluster) -> Plan:
        """Raise ValueError naming what this plan cannot do on ``model`` and ``cluster``."""
        if self.gpus != cluster.gpus:
            raise ValueError(f"plan dp*pp*tp = {self.dp}*{self.pp}*{self.tp} = {self.gpus} "
                             f"GPUs, but the cluster has {cluster.gpus}")
        if self.tp > model.heads or model.heads % self.tp:
            raise ValueError(f"tp={self.tp} must divide heads={model.heads}: tensor "
                             "parallelism gives each rank whole attention heads")
        if self.pp > model.layers:
            raise ValueError(f"pp={self.pp} > layers={model.layers}: a pipeline stage needs "
                             "at least one layer")
        if model.layers % (self.pp * self.chunks):
            raise ValueError(f"pp*chunks = {self.pp}*{self.chunks} must divide "
                             f"layers={model.layers}: every stage gets the same layers")
        if self.sequence_parallel and model.seq % self.tp:
            raise ValueError(f"sequence_parallel needs tp={self.tp} to divide "
                             f"seq={model.seq}")
        return self

    def __str__(self) -> str:
        extra = [f"ZeRO-{self.zero_stage}"] if self.zero_stage else []
        extra += [] if self.recompute == "none" else [f"recompute={self.recompute}"]
        extra += ["SP"] if self.sequence_parallel else []
        extra += [f"v={self.chunks}"] if self.chunks > 1 else []
        extra += [] if self.scatter_gather else ["no scatter/gather"]
        return " ".join([f"dp={self.dp} pp={self.pp} tp={self.tp} m={self.microbatches} "
                         f"b={self.micro_batch_size} {self.precision}", *extra])
