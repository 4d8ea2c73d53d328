"""Collectives on CUDA tensors: the local backend stages them through host memory (several
ranks share one GPU) and reduces on the GPU. Skipped where no GPU is present."""

from __future__ import annotations

import pytest
import torch
from collectives_ref import check, input_of
from test_collectives import all_reduce_cases, other_cases

import minidist as md

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]


def _cuda_cases(comm, cases):
    outs, devices = [], set()
    for case in cases:
        fn, kw = case["fn"], case["kw"]
        x = input_of(case, comm.rank, comm.world_size).to(comm.device)
        if fn == "scatter" and comm.rank != kw.get("src", 0):
            x = torch.empty(tuple(case["shape"]), dtype=case["dtype"], device=comm.device)
        out = getattr(md, fn)(comm, x, **kw)
        if out is not None:
            devices.add(out.device.type)
            out = out.cpu()
        outs.append(out)
    return outs, devices


def test_cuda_tensors_on_the_local_backend():
    p = 3
    cases = [c for c in all_reduce_cases(p) + other_cases(p)
             if c["dtype"] in (torch.float16, torch.float32, torch.int64)][::2]
    out = md.launch(_cuda_cases, p, args=(cases,), device="cuda")
    assert all(devices == {"cuda"} for _, devices in out)
    for i, case in enumerate(cases):
        check(case, [o[0][i] for o in out], p)
