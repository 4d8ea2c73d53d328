"""The same split in torch's own tensor parallelism, for tests and benchmarks to compare with.

``torch.distributed.tensor.parallel.parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel`` (the PyTorch tensor-parallel tutorial's plan), over a ``DeviceMesh``:
``init_device_mesh("cpu", (p,))`` on gloo, under ``md.launch(..., backend="torch")``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ...models.gpt import GPT
from .parallel_gpt import qkv_rows


def torch_parallelize(gpt: GPT, mesh) -> GPT:
    """A copy of ``gpt`` split by torch's own tensor parallelism over ``mesh``, as
    ``parallelize_gpt`` splits it. ``ColwiseParallel`` cuts ``c_attn``'s rows into p
    contiguous blocks, so the rows are first permuted to [q_0 k_0 v_0 q_1 k_1 v_1 ...]
    (``qkv_rows``) and each rank's attention runs on n_head / p heads. The head's output
    stays sharded for ``loss_parallel``; a tied head is re-tied to the embedding's shard."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    cfg, p = gpt.config, mesh.size()
    model = copy.deepcopy(gpt)
    perm = torch.cat([qkv_rows(cfg.n_embd, cfg.n_head, r, p) for r in range(p)])
    plan = {"transformer.wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i, block in enumerate(model.transformer.h):
        with torch.no_grad():
            for t in (block.attn.c_attn.weight, block.attn.c_attn.bias):
                if t is not None:
                    t.copy_(t[perm])
        block.attn.n_head = cfg.n_head // p
        for name, style in (("attn.c_attn", ColwiseParallel()), ("attn.c_proj", RowwiseParallel()),
                            ("mlp.c_fc", ColwiseParallel()), ("mlp.c_proj", RowwiseParallel())):
            plan[f"transformer.h.{i}.{name}"] = style
    parallelize_module(model, mesh, plan)
    if cfg.tie_weights:
        model.lm_head.weight = model.transformer.wte.weight
    return model


def torch_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Forward and backward of ``torch_parallelize``'s model; returns the loss (a DTensor)."""
    from torch.distributed.tensor.parallel import loss_parallel
    x = idx
    for stage in model.stages():
        x = stage(x)
    with loss_parallel():
        loss = F.cross_entropy(x.reshape(-1, x.shape[-1]), targets.reshape(-1))
        loss.backward()
    return loss
