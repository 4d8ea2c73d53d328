"""The shared-memory path of the sync parameter server (``shared_shards.py``) against the
message path and one process: the same parameters (float64, 1e-12), the same bytes counted,
chosen only where the ranks share memory, no name left in /dev/shm, clear errors.

Tolerance: as in ``test_ps_sync.py`` (a sync step differs from the full-batch step only in
the order terms are summed). Between the two paths the arithmetic is the same, in the same
order, so the parameters are compared bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from oracles import assert_params_close, params_of, train_single
from test_ps_sync import SGD, SLICE, batches, mlp, ps_train

import minidist as md

ATOL = 1e-12


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _rank(comm, num_servers: int, shared, dtype=torch.float64):
    model = mlp(seed=comm.rank).to(dtype)
    ps = md.ParameterServer(comm, model, num_servers=num_servers, slice_threshold=SLICE,
                            shared_memory=shared, **SGD)
    comm.stats.reset()  # leave out the construction's messages
    if ps.is_server:
        report = ps.serve()
        return ps.shared_memory, comm.stats.bytes_received, comm.stats.bytes_sent, report
    ps_train(comm, ps, model, [(x.to(dtype), y.to(dtype)) for x, y in batches()])
    return ps.shared_memory, comm.stats.bytes_received, comm.stats.bytes_sent, \
        params_of(model)


@pytest.mark.parametrize("num_servers,workers", [(1, 1), (1, 3), (2, 2), (3, 4)])
def test_shared_equals_messages_equals_one_process(num_servers, workers):
    want = train_single(lambda: mlp(seed=0), batches(), **SGD)
    world = num_servers + workers
    fast = md.launch(_rank, world, args=(num_servers, None), timeout=60)
    slow = md.launch(_rank, world, args=(num_servers, False), timeout=60)
    assert all(r[0] for r in fast) and not any(r[0] for r in slow)
    for f, s in zip(fast[num_servers:], slow[num_servers:]):
        assert_params_close(f[3], want.params, atol=ATOL)
        assert same_bits(f[3], s[3])
    for f, s in zip(fast, slow):  # the bytes counted are those of the messages replaced
        assert f[1:3] == s[1:3]
    for f, s in zip(fast[:num_servers], slow[:num_servers]):
        assert (f[3].bytes_in, f[3].bytes_out) == (s[3].bytes_in, s[3].bytes_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_shared_other_dtypes(dtype):
    fast = md.launch(_rank, 3, args=(1, True, dtype), timeout=60)
    slow = md.launch(_rank, 3, args=(1, False, dtype), timeout=60)
    for f, s in zip(fast[1:], slow[1:]):
        assert same_bits(f[3], s[3]) and all(a.dtype == dtype for a in f[3].values())


def _tiny_rank(comm, shared):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2, bias=False).double()  # one tensor: servers 1, 2 own nothing
    ps = md.ParameterServer(comm, model, num_servers=3, slice_threshold=None,
                            shared_memory=shared, lr=0.1)
    if ps.is_server:
        return ps.serve().numel
    x = torch.ones(4, 3, dtype=torch.float64)
    for _ in range(3):
        ps.pull()
        model.zero_grad()
        model(x).sum().backward()
        ps.push()
    ps.close()
    return params_of(model)


def test_servers_that_own_nothing():
    fast = md.launch(_tiny_rank, 5, args=(True,), timeout=60)
    slow = md.launch(_tiny_rank, 5, args=(False,), timeout=60)
    assert fast[:3] == [6, 0, 0]
    for f, s in zip(fast[3:], slow[3:]):
        assert same_bits(f, s)


def _twice_rank(comm, shared):
    """Two pushes without a pull between them, then a pull: it reflects both steps."""
    model = mlp(seed=0)
    ps = md.ParameterServer(comm, model, shared_memory=shared, **SGD)
    if ps.is_server:
        return ps.serve().updates
    (x, y), (x2, y2) = batches(2)
    ps.pull()
    for xb, yb in ((x, y), (x2, y2)):
        model.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        ps.push()
    version = ps.pull()
    ps.close()
    return version, params_of(model)


def test_two_pushes_then_a_pull_reflects_both():
    fast = md.launch(_twice_rank, 3, args=(True,), timeout=60)
    slow = md.launch(_twice_rank, 3, args=(False,), timeout=60)
    assert fast[0] == slow[0] == 2
    for (fv, fp), (sv, sp) in zip(fast[1:], slow[1:]):
        assert fv == sv == 2
        assert same_bits(fp, sp)


def _which(comm, mode, shared):
    ps = md.ParameterServer(comm, mlp(), mode=mode, shared_memory=shared, lr=0.1)
    if not ps.is_server:
        ps.close()
    else:
        ps.serve()
    return ps.shared_memory


def test_chosen_only_where_ranks_share_memory():
    assert md.launch(_which, 3, args=("sync", None)) == [True] * 3
    assert md.launch(_which, 3, args=("async", None)) == [False] * 3  # messages: see docs
    assert md.launch(_which, 3, args=("ssp", None)) == [False] * 3
    net = md.Network.uniform(md.Link(alpha=1e-5, bandwidth=1e9))
    assert md.launch(_which, 3, args=("sync", None), network=net) == [False] * 3
    assert md.launch(_which, 3, args=("sync", None), backend="torch",
                     timeout=60) == [False] * 3


def test_required_but_impossible_names_the_reason():
    net = md.Network.uniform(md.Link(alpha=1e-5, bandwidth=1e9))
    with pytest.raises(md.WorkerError, match=r"shared_memory=True\), but rank 0 cannot share "
                                             r"memory .* 'shared_memory' capability"):
        md.launch(_which, 3, args=("sync", True), network=net, timeout=30)
    with pytest.raises(ValueError, match=r"shared_memory=True needs mode='sync'"):
        md.ParameterServer(_Stub(), mlp(), mode="async", shared_memory=True)
    with pytest.raises(TypeError, match=r"shared_memory must be None .* got 'yes'"):
        md.ParameterServer(_Stub(), mlp(), shared_memory="yes")


class _Stub:
    world_size, rank = 3, 0


def _names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("md-")}


def _names_after_construction(comm):
    ps = md.ParameterServer(comm, mlp(), num_servers=2, shared_memory=True, lr=0.1)
    comm.barrier()  # every server is past its unlink
    left = _names()
    comm.barrier()
    if ps.is_server:
        ps.serve()
    else:
        ps.close()
    return left


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm to look at")
def test_no_name_left_in_dev_shm():
    before = _names()
    during = md.launch(_names_after_construction, 4, timeout=30)
    # at most the launch's own segment: the servers removed their buffers' names
    assert all(len(names - before) <= 1 for names in during)
    assert _names() == before


def _dying_worker(comm):
    model = mlp()
    ps = md.ParameterServer(comm, model, shared_memory=True, on_worker_exit="continue", **SGD)
    if ps.is_server:
        return ps.serve().departed
    for i, (x, y) in enumerate(batches()):
        ps.pull()
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        ps.push()
        if comm.rank == 2 and i == 1:
            return "gone"  # returns without close(): a death, as the server sees it
    ps.close()
    return "done"


def test_a_dead_worker_in_shared_memory_sync():
    out = md.launch(_dying_worker, 3, timeout=30)
    assert out[1:] == ["done", "gone"]
    assert out[0] == {1: "closed", 2: "died"}
