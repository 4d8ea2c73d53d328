"""minidist's tensor-parallel GPT against torch's own: ``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel`` on a gloo process group (``init_device_mesh("cpu",
(p,))`` under ``md.launch(backend="torch")``), the same layout
(``parallel.tensor.torch_reference.torch_parallelize``). Same loss, logits and gradients of
every parameter, step after step."""

from __future__ import annotations

import pytest
import torch

import minidist as md
from minidist.models import GPT, GPTConfig, synthetic_tokens
from minidist.parallel.tensor import qkv_rows
from minidist.parallel.tensor.torch_reference import torch_loss, torch_parallelize

CFG = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_embd=16)
STEPS = 2
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def _torch_full(model, cfg: GPTConfig, p: int, grad: bool) -> dict[str, torch.Tensor]:
    """torch's parameters (or gradients) gathered, c_attn's rows put back in nanoGPT order."""
    perm = torch.cat([qkv_rows(cfg.n_embd, cfg.n_head, r, p) for r in range(p)])
    out = {}
    for name, param in model.named_parameters():
        t = param.grad if grad else param
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        if "c_attn" in name:
            placed = torch.empty_like(t)
            placed[perm] = t  # torch's row k is nanoGPT's row perm[k]
            t = placed
        out[name] = t.detach()
    return out


def _rank(comm, algorithm: str):
    from torch.distributed.device_mesh import init_device_mesh
    p = comm.world_size
    theirs = torch_parallelize(GPT(CFG).double(), init_device_mesh("cpu", (p,)))
    ours = md.parallelize_gpt(GPT(CFG).double(), comm, algorithm=algorithm)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    for x, y in synthetic_tokens(STEPS, 2, CFG.block_size, CFG.vocab_size, seed=3):
        opt_theirs.zero_grad()
        opt_ours.zero_grad()
        loss_theirs = torch_loss(theirs, x, y)
        logits, loss = ours(x, y, gather_logits=True)
        loss.backward()
        torch.testing.assert_close(loss, loss_theirs.full_tensor(), **TIGHT)
        x_theirs = x
        for stage in theirs.stages():
            x_theirs = stage(x_theirs)
        torch.testing.assert_close(logits, x_theirs.full_tensor().detach(), **TIGHT)
        grads_theirs, grads = _torch_full(theirs, CFG, p, grad=True), ours.full_parameters(True)
        assert list(grads) == list(grads_theirs)
        for name, g in grads.items():
            torch.testing.assert_close(g, grads_theirs[name], **TIGHT, msg=name)
        opt_theirs.step()
        opt_ours.step()
    params_theirs, params = _torch_full(theirs, CFG, p, grad=False), ours.full_parameters()
    for name, t in params.items():
        torch.testing.assert_close(t, params_theirs[name], **TIGHT, msg=name)


@pytest.mark.parametrize("world_size,algorithm", [(2, "auto"), (4, "ring")])
def test_matches_torch_tensor_parallel(world_size, algorithm):
    """``auto`` on the torch backend is gloo's own all-reduce; ``ring`` is minidist's over
    the same process group."""
    md.launch(_rank, world_size, args=(algorithm,), backend="torch", timeout=120)
