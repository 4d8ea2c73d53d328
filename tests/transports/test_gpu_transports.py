"""CUDA: tensors staged through host memory on the local backend (several ranks sharing
one GPU), and NCCL through the torch backend. Skipped where no GPU is present."""

from __future__ import annotations

import pytest
import torch

import minidist as md

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]


def _cuda_ring(comm, n):
    dev = comm.device
    x = torch.arange(n, device=dev, dtype=torch.float32) + comm.rank
    y = torch.empty(n, device=dev)
    comm.sendrecv(x, (comm.rank + 1) % comm.world_size, y, (comm.rank - 1) % comm.world_size)
    return y.cpu(), str(y.device)


def test_local_backend_cuda_tensors_share_one_gpu():
    out = md.launch(_cuda_ring, 4, args=(1 << 20,), device="cuda")
    for r, (y, dev) in enumerate(out):
        assert dev.startswith("cuda")
        assert torch.equal(y, torch.arange(1 << 20, dtype=torch.float32) + (r - 1) % 4)


def test_torch_backend_nccl_world_size_one():
    def fn(comm):
        x = torch.ones(10, device=comm.device)
        comm.barrier()
        return x.sum().item(), comm.backend, str(comm.device)

    total, backend, dev = md.launch(fn, 1, backend="torch", device="cuda")[0]
    assert total == 10.0 and backend == "torch" and dev.startswith("cuda")
