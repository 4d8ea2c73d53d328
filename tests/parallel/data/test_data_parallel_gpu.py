"""DDP with CUDA parameters: buckets on the GPU, staged through host memory by the local
backend (two ranks sharing one GPU). Skipped where no GPU is present."""

from __future__ import annotations

import pytest
import torch
from oracles import assert_params_close, params_of, train_single
from test_data_parallel import ATOL, SGD, batches, mlp, train

import minidist as md

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]


def _cuda_rank(comm):
    out = []
    data = [(x.to(comm.device), y.to(comm.device)) for x, y in batches("mlp")]
    for overlap in (True, False):
        model = mlp(seed=comm.rank).to(comm.device)
        ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=1e-6, overlap=overlap)
        train(ddp, data, comm.rank, comm.world_size)
        out.append({n: p.cpu() for n, p in params_of(model).items()})
    return out


def test_ddp_on_cuda_matches_one_process():
    want = train_single(lambda: mlp().cuda(), [(x.cuda(), y.cuda()) for x, y in batches("mlp")],
                        **SGD).params
    for rank_out in md.launch(_cuda_rank, 2, device="cuda"):
        for got in rank_out:
            assert_params_close(got, want, atol=ATOL)
