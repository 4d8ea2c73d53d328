"""Data parallelism: DDP and the naive version train exactly like one process on the whole
batch, match torch's DDP, and fail with errors that name the mistake.

Tolerance. Models and data are float64. Data-parallel training differs from one process only
in the order in which per-sample gradient terms are summed (each rank sums its own B/p
samples, then the ranks' sums are added), so a gradient element differs by at most about
B * eps * (sum of its terms' magnitudes), eps = 1.1e-16: ~1e-15 here, and four SGD steps with
lr 0.1 on these small well-conditioned models keep parameter differences at that level (the
largest observed is 6e-17). We allow 1e-13 absolute on O(1) parameters: a hundred times that
bound, and many orders of magnitude below what any real bug (a missing 1/p, a stale bucket, a
gradient reduced twice or not at all) causes. The reference training and the comparisons are
``tests/oracles.py``, shared with every strategy.
"""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from oracles import (
    assert_params_close,
    assert_replicas_bitwise,
    params_of,
    train_single,
    train_steps,
)
from torch import nn

import minidist as md
from minidist.parallel.data.buckets import assign_buckets

ATOL = 1e-13
B, STEPS = 12, 4  # global batch: divisible by every world size tested (1, 2, 3, 4)
SGD = {"lr": 0.1, "momentum": 0.9}  # the optimizer of every run here (torch.optim.SGD)


# -- models and data ---------------------------------------------------------------------------
def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3)).double()


def cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3),
                         nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)).double()


MODELS = {"mlp": (mlp, (6,)), "cnn": (cnn, (2, 6, 6))}


def batches(kind: str, steps: int = STEPS, batch: int = B) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    shape = MODELS[kind][1]
    return [(torch.randn(batch, *shape, generator=g, dtype=torch.float64),
             torch.randn(batch, 3, generator=g, dtype=torch.float64)) for _ in range(steps)]


def train(model, data, rank: int = 0, world: int = 1) -> list[float]:
    """SGD with momentum on this rank's slice of every global batch (``oracles``)."""
    return train_steps(model, data, rank=rank, world=world, **SGD)


# -- equivalence with one process ----------------------------------------------------------------
TINY, HUGE = 1e-6, 1000.0  # bucket caps: below one parameter's size, above the whole model
CONFIGS = [
    ("naive", {}),
    ("ddp", {"overlap": True, "bucket_cap_mb": TINY}),
    ("ddp", {"overlap": False, "bucket_cap_mb": TINY}),
    ("ddp", {"overlap": True, "bucket_cap_mb": HUGE}),
    ("ddp", {"overlap": False, "bucket_cap_mb": HUGE}),
    ("ddp", {"overlap": True, "bucket_cap_mb": 0.002, "gradient_as_bucket_view": True}),
]


def wrap(comm, model, kind: str, kwargs: dict):
    if kind == "naive":
        return md.DataParallelNaive(model, comm)
    return md.DistributedDataParallel(model, comm, **kwargs)


def _equivalence_rank(comm):
    out = {}
    for name, (make, _) in MODELS.items():
        data = batches(name)
        for i, (kind, kwargs) in enumerate(CONFIGS):
            model = make(seed=comm.rank)  # replicas start different: DDP copies rank 0's
            ddp = wrap(comm, model, kind, kwargs)
            train(ddp, data, comm.rank, comm.world_size)
            assert_replicas_bitwise(comm, model)  # every rank receives the same sums
            nb = len(ddp.buckets) if kind == "ddp" else None
            out[name, i] = (params_of(model), nb)
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_matches_single_process(world_size):
    results = md.launch(_equivalence_rank, world_size)
    for name, (make, _) in MODELS.items():
        want = train_single(make, batches(name), **SGD).params
        n_params = len(want)
        for i, (_, kwargs) in enumerate(CONFIGS):
            for rank in range(world_size):
                got, nb = results[rank][name, i]
                assert_params_close(got, want, atol=ATOL)
            if kwargs.get("bucket_cap_mb") == TINY:
                assert nb == n_params
            if kwargs.get("bucket_cap_mb") == HUGE:
                assert nb == 1


# -- the same loop under torch's DDP ---------------------------------------------------------------
def _torch_vs_minidist(comm):
    torch_ddp = nn.parallel.DistributedDataParallel(cnn(seed=comm.rank))
    ours = md.DistributedDataParallel(cnn(seed=comm.rank), comm, bucket_cap_mb=0.001)
    data = batches("cnn", steps=6)
    return (train(torch_ddp, data, comm.rank, comm.world_size),
            train(ours, data, comm.rank, comm.world_size),
            params_of(torch_ddp.module), params_of(ours.module))


def test_matches_torch_ddp():
    """One torch-backend launch: torch's DDP on gloo, and minidist's DDP over the same
    process group (minidist's torch transport), run the same loop."""
    for theirs, ours, p_theirs, p_ours in md.launch(_torch_vs_minidist, 2, backend="torch"):
        assert len(theirs) == 6
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
        assert_params_close(p_ours, p_theirs, atol=ATOL)


# -- gradient accumulation -------------------------------------------------------------------------
ACCUM = 3  # micro-batches per optimizer step


def accumulate(comm, model, data) -> list[int]:
    """ACCUM micro-batches per step, the first ACCUM-1 under no_sync; returns, per step, the
    payload bytes this rank sent during the no_sync passes (must be 0)."""
    opt = torch.optim.SGD(model.parameters(), **SGD)
    quiet = []
    for x, y in data:
        xs = x.chunk(comm.world_size)[comm.rank].chunk(ACCUM)
        ys = y.chunk(comm.world_size)[comm.rank].chunk(ACCUM)
        opt.zero_grad()
        before = comm.stats.bytes_sent
        with model.no_sync():
            for j in range(ACCUM - 1):
                (F.mse_loss(model(xs[j]), ys[j]) / ACCUM).backward()
        quiet.append(comm.stats.bytes_sent - before)
        (F.mse_loss(model(xs[-1]), ys[-1]) / ACCUM).backward()
        opt.step()
    return quiet


def _no_sync_rank(comm):
    data = batches("mlp", steps=2, batch=B)
    out = []
    for kind, kwargs in CONFIGS:
        model = mlp(seed=comm.rank)
        quiet = accumulate(comm, wrap(comm, model, kind, kwargs), data)
        out.append((params_of(model), quiet))
    return out


def test_no_sync_accumulation_equals_one_large_batch():
    # one step per batch of B, no accumulation
    want = train_single(mlp, batches("mlp", steps=2, batch=B), **SGD).params
    for rank_out in md.launch(_no_sync_rank, 2):
        for got, quiet in rank_out:
            assert quiet == [0, 0]
            assert_params_close(got, want, atol=ATOL)


# -- unused parameters ----------------------------------------------------------------------------
class Branchy(nn.Module):
    """``extra`` is used only when asked (here: by some ranks), ``never`` is never used."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk, self.extra = nn.Linear(4, 4), nn.Linear(4, 4)
        self.never, self.head = nn.Linear(4, 4), nn.Linear(4, 2)
        self.double()

    def forward(self, x, use_extra: bool):
        h = torch.tanh(self.trunk(x))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(h)


def branchy_steps(model, data, uses, ranks: list[int], world: int):
    """Step s: rank r uses ``extra`` iff ``uses[s][r]``. A DDP rank passes ``ranks=[rank]``;
    one process reproduces DDP with all ranks' slices and the mean of their losses."""
    opt = torch.optim.SGD(model.parameters(), **SGD)
    for (x, y), use in zip(data, uses):
        opt.zero_grad()
        losses = [F.mse_loss(model(x.chunk(world)[r], use[r]), y.chunk(world)[r])
                  for r in ranks]
        (sum(losses) / len(losses)).backward()
        opt.step()


USES = [(True, False), (False, False), (False, True), (True, True)]  # per step, per rank


def _unused_rank(comm):
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(B, 4, generator=g, dtype=torch.float64),
             torch.randn(B, 2, generator=g, dtype=torch.float64)) for _ in USES]
    out = []
    for overlap in (True, False):
        for cap in (TINY, HUGE):
            model = Branchy(seed=comm.rank)
            ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=cap, overlap=overlap,
                                             find_unused_parameters=True,
                                             gradient_as_bucket_view=cap == TINY)
            branchy_steps(ddp, data, USES, [comm.rank], comm.world_size)
            out.append((params_of(model), model.never.weight.grad))
    ddp = md.DistributedDataParallel(Branchy(), comm)  # without find_unused_parameters
    try:
        ddp(data[0][0], True).sum().backward()
    except RuntimeError as e:
        return out, str(e), data
    return out, None, data


def test_unused_parameters():
    results = md.launch(_unused_rank, 2)
    ref = Branchy()
    branchy_steps(ref, results[0][2], USES, [0, 1], 2)  # one process, both halves
    assert ref.never.weight.grad is None
    for out, err, _ in results:
        for got, never_grad in out:
            assert_params_close(got, params_of(ref), atol=ATOL)
            assert never_grad is None  # unused on every rank: .grad left alone, as in torch
        assert err is not None
        assert "'never.weight'" in err and "'never.bias'" in err
        assert "find_unused_parameters=True" in err


# -- comm hooks, overlap, timeline, straggler, buffers ------------------------------------------
def _hooks_rank(comm):
    calls = []

    def summing(comm_, bucket):  # a hook that sums instead of averaging, and returns a copy
        calls.append((bucket.index, threading.current_thread().name))
        md.all_reduce(comm_, bucket.buffer, op="sum")
        return bucket.buffer.clone()

    x, y = batches("mlp", steps=1)[0]
    x, y = x.chunk(2)[comm.rank], y.chunk(2)[comm.rank]
    grads, threads = {}, {}
    for name, kwargs in (("avg", {}), ("sum", {"comm_hook": summing}),
                         ("sum_late", {"overlap": False})):
        ddp = md.DistributedDataParallel(mlp(), comm, bucket_cap_mb=TINY, **kwargs)
        if name == "sum_late":
            ddp.register_comm_hook(summing)
        calls.clear()
        F.mse_loss(ddp(x), y).backward()
        grads[name] = [p.grad.clone() for p in ddp.module.parameters()]
        threads[name] = list(calls)
    return grads, threads, len(ddp.buckets)


def test_comm_hook_replaces_the_reduction():
    for grads, threads, n in md.launch(_hooks_rank, 2):
        for name in ("sum", "sum_late"):
            for g_sum, g_avg in zip(grads[name], grads["avg"]):
                torch.testing.assert_close(g_sum, 2 * g_avg, rtol=1e-14, atol=0)
        # buckets are reduced in index order; those started during backward on the
        # communication thread, the last one (ready when backward ends) on the caller's
        assert threads["sum"] == [(i, "minidist-ddp-comm") for i in range(n - 1)] + [
            (n - 1, "MainThread")]
        assert threads["sum_late"] == [(i, "MainThread") for i in range(n)]


class Counter(nn.Module):
    """A buffer that each rank changes differently in forward; records it on entry."""

    def __init__(self, rank: int):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.register_buffer("count", torch.full((3,), float(rank)))
        self.seen: list[list[float]] = []

    def forward(self, x):
        self.seen.append(self.count.tolist())
        self.count += torch.arange(3.0) + 1
        return torch.tanh(self.lin2(torch.tanh(self.lin1(x))))


def _timeline_rank(comm):
    comm.timeline.enable()
    out = {}
    for overlap in (True, False):
        model = Counter(comm.rank)
        ddp = md.DistributedDataParallel(model, comm, bucket_cap_mb=TINY, overlap=overlap)
        comm.timeline.clear()
        with md.slow_rank(comm, rank=1, seconds=0.02):
            for _ in range(2):
                ddp(torch.randn(64, 8)).sum().backward()
        out[overlap] = (comm.timeline.as_dicts(), ddp.last_sync, model.seen)
    return out


def test_overlap_timeline_straggler_and_buffers():
    res = md.launch(_timeline_rank, 2)
    for rank in (0, 1):
        for overlap in (True, False):
            events, sync, seen = res[rank][overlap]
            names = [e["name"] for e in events]
            for name in ("forward", "backward", "bucket 0", "bucket 3", "wait for buckets"):
                assert name in names
            delays = [e["end"] - e["start"] for e in events if e["name"] == "straggler delay"]
            assert len(delays) == (2 if rank == 1 else 0) and min(delays, default=1) >= 0.02
            backward_end = max(e["end"] for e in events if e["name"] == "backward")
            bucket_start = [e["start"] for e in events if e["name"] == "bucket 0"][-1]
            # Without overlap every bucket waits for the end of backward. With overlap the
            # first bucket (the last layer) is handed to the comm thread while gradients of
            # the first layer are still missing: that is what lets it overlap backward.
            if overlap:
                assert sync["pending_at_launch"][0] > 0
            else:
                assert sync["pending_at_launch"] == [0] * sync["buckets"]
                assert bucket_start >= backward_end
            assert sync["comm_s"] > 0 and sync["wait_s"] > 0
            # buffers are broadcast from rank 0 at construction and before every forward
            assert seen == [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]


def test_bucket_assignment():
    p = [torch.empty(n) for n in (10, 20, 30, 40)]  # 40, 80, 120, 160 bytes
    assert assign_buckets(p, 1) == [[3], [2], [1], [0]]  # cap below every parameter
    assert assign_buckets(p, 10**9) == [[3, 2, 1, 0]]  # one bucket, reverse order
    assert assign_buckets(p, 200) == [[3, 2], [1, 0]]  # closed once 200 bytes are reached
    mixed = [torch.empty(10), torch.empty(10, dtype=torch.float64), torch.empty(10),
             torch.empty(10, dtype=torch.float64)]
    assert assign_buckets(mixed, 10**9) == [[3, 1], [2, 0]]  # one dtype per bucket
    assert assign_buckets(mixed, 80) == [[3], [1], [2, 0]]  # in the order they complete


# -- errors ---------------------------------------------------------------------------------------
def _error(fn) -> str | None:
    try:
        fn()
    except (ValueError, RuntimeError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x, branch):
        return (self.a if branch == "a" else self.b)(x)


def _errors_rank(comm):
    r = comm.rank

    def differing(change):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        if r == 1:
            change(model)
        return lambda: md.DistributedDataParallel(model, comm)

    def twice():
        ddp = md.DistributedDataParallel(TwoBranches(), comm, find_unused_parameters=True)
        x = torch.randn(2, 3)
        (ddp(x, "a") + ddp(x, "b")).sum().backward()

    def bad_hook():
        ddp = md.DistributedDataParallel(mlp(), comm, comm_hook=lambda c, b: b.buffer[:1])
        ddp(torch.randn(2, 6, dtype=torch.float64)).sum().backward()

    checks = {
        "shape": differing(lambda m: m.__setitem__(1, nn.Linear(4, 3))),
        "extra": differing(lambda m: m.append(nn.Linear(2, 2))),
        "dtype": differing(lambda m: m[0].double()),
        "frozen": differing(lambda m: m[0].bias.requires_grad_(False)),
        "twice": twice,
        "hook": bad_hook,
    }
    out = {name: _error(check) for name, check in checks.items()}
    ddp = md.DistributedDataParallel(mlp(), comm)  # still usable after all those errors
    ddp(torch.randn(2, 6, dtype=torch.float64)).sum().backward()
    return out


def test_errors_across_ranks():
    for out in md.launch(_errors_rank, 2):
        assert "'1.weight' has shape (2, 4) on rank 0 and (3, 4) on rank 1" in out["shape"]
        assert "rank 1 has a param '2.weight', which rank 0 lacks" in out["extra"]
        assert "'0.weight' has dtype torch.float32 on rank 0 and torch.float64" in out["dtype"]
        assert "'0.bias' has requires_grad True on rank 0 and False on rank 1" in out["frozen"]
        assert re.search(r"'a\.(weight|bias)' got its gradient twice", out["twice"])
        assert "comm hook must return a tensor shaped like bucket.buffer" in out["hook"]


def test_argument_errors():
    comm = SimpleNamespace(rank=0, world_size=2, isend=None)
    model = nn.Linear(2, 2)
    bad = [
        (lambda: md.DistributedDataParallel("model", comm), TypeError, "torch.nn.Module"),
        (lambda: md.DistributedDataParallel(model, object()), TypeError, "Communicator"),
        (lambda: md.DistributedDataParallel(nn.ReLU(), comm), ValueError, "requires a grad"),
        (lambda: md.DistributedDataParallel(model, comm, bucket_cap_mb=0), ValueError,
         "bucket_cap_mb must be a positive"),
        (lambda: md.DistributedDataParallel(model, comm, comm_hook=3), TypeError,
         "comm_hook must be callable"),
        (lambda: md.DataParallelNaive(nn.ReLU(), comm), ValueError, "requires a grad"),
    ]
    for fn, exc, match in bad:
        with pytest.raises(exc, match=match):
            fn()

