"""Shared fixtures: every test checks that it leaked no process and no shared memory."""

from __future__ import annotations

import os

import pytest
import torch

# Backends every communicator test runs on. The torch backend (gloo) starts slower, so
# tests batch many checks into one launch.
BACKENDS = ["local", "torch"]
ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
              torch.int64]


def child_pids() -> set[int]:
    """Live processes whose parent is this process (zombies excluded)."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.add(int(entry))
    return out


def our_segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"md-{os.getpid()}-")}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leaks():
    """After each test: no child process of ours is alive, no segment of ours is left."""
    before = child_pids()
    yield
    leaked_procs = child_pids() - before
    leaked_shm = our_segments()
    assert not leaked_procs, f"processes outlived the test: {sorted(leaked_procs)}"
    assert not leaked_shm, f"shared memory outlived the test: {sorted(leaked_shm)}"


@pytest.fixture(autouse=True)
def no_global_torch_state():
    """A test must leave torch's process-wide defaults as it found them: ranks fork from this
    process, so a leaked default dtype changes every later test's tensors."""
    dtype = torch.get_default_dtype()
    yield
    leaked = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    assert leaked == dtype, f"the default dtype changed to {leaked} and was not restored"


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
