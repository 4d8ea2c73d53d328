"""The ``device`` fixture of the strategy suite: every test taking it runs on the CPU and,
where torch sees a CUDA GPU, again on it, with the same assertions. The CUDA cases carry
the ``gpu`` marker, so ``pytest -m gpu`` runs them (and every other GPU test) alone."""

from __future__ import annotations

import pytest
import torch

CUDA = pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")])


@pytest.fixture(params=["cpu", CUDA])
def device(request) -> str:
    return request.param
