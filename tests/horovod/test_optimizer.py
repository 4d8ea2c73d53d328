"""hvd.DistributedOptimizer against two oracles, in float64: one process training on the
whole batch, and torch's own DistributedDataParallel over gloo on the same ranks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import minidist as md
import minidist.horovod as hvd

P, B, STEPS, TOL = 2, 4, 3, 1e-12


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def batch(step: int, micro: int = 0):
    g = torch.Generator().manual_seed(100 * step + micro)
    return torch.randn(P * B, 5, generator=g, dtype=torch.float64), \
        torch.randn(P * B, 3, generator=g, dtype=torch.float64)


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def one_process(make_opt, passes: int = 1, clip: float | None = None) -> list[torch.Tensor]:
    """The oracle: the full batch, every micro-batch's gradient summed, on one process."""
    model = make_model()
    opt = make_opt(model.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        for m in range(passes):
            loss_of(model, *batch(step, m)).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return [p.detach() for p in model.parameters()]


def shard(t: torch.Tensor, r: int) -> torch.Tensor:
    return t[r * B:(r + 1) * B]


def _train(comm, make_opt, kwargs, passes=1, clip=None):
    hvd.init(comm)
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(), **kwargs)
    started = []
    for step in range(STEPS):
        opt.zero_grad()
        for m in range(passes):
            x, y = batch(step, m)
            loss_of(model, shard(x, comm.rank), shard(y, comm.rank)).backward()
        started.append(len(opt._handles))  # allreduces the hooks started during backward
        if clip is None:
            opt.step()
        else:
            opt.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
    hvd.shutdown()
    return [p.detach() for p in model.parameters()], started


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


CASES = {
    "sgd": (sgd, {}, 1, None, sgd),
    "adam": (adam, {}, 1, None, adam),
    "two passes per step": (sgd, {"backward_passes_per_step": 2}, 2, None, sgd),
    "predivide": (sgd, {"gradient_predivide_factor": 4.0}, 1, None, sgd),
    "sum": (lambda ps: torch.optim.SGD(ps, lr=0.1), {"op": hvd.Sum}, 1, None,
            lambda ps: torch.optim.SGD(ps, lr=0.1 * P)),
    "synchronize, clip, skip_synchronize": (sgd, {}, 1, 0.05, sgd),
}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_one_process_on_the_whole_batch(case):
    make_opt, kwargs, passes, clip, oracle_opt = CASES[case]
    want = one_process(oracle_opt, passes, clip)
    for params, started in md.launch(_train, P, args=(make_opt, kwargs, passes, clip)):
        for got, w in zip(params, want):
            torch.testing.assert_close(got, w, rtol=TOL, atol=TOL)
        assert started == [len(want)] * STEPS  # every gradient's allreduce began in backward


def _fp16(comm):
    params, _ = _train(comm, sgd, {"compression": hvd.Compression.fp16})
    return params


def test_fp16_compression_is_close():
    want = one_process(sgd)
    for params in md.launch(_fp16, P):
        for got, w in zip(params, want):
            torch.testing.assert_close(got, w, rtol=2e-3, atol=2e-3)


def _against_ddp(comm):
    """The same steps through hvd.DistributedOptimizer and torch's DDP on the same gloo
    group (md.launch(backend="torch") made it)."""
    hvd.init(comm)
    ours, theirs = make_model(), make_model()
    ddp = nn.parallel.DistributedDataParallel(theirs, process_group=comm.capability(
        "process_group"))
    opt = hvd.DistributedOptimizer(sgd(ours.parameters()),
                                   named_parameters=ours.named_parameters())
    ddp_opt = sgd(ddp.parameters())
    for step in range(STEPS):
        x, y = (shard(t, comm.rank) for t in batch(step))
        for model, o in ((ours, opt), (ddp, ddp_opt)):
            o.zero_grad()
            loss_of(model, x, y).backward()
            o.step()
    hvd.shutdown()
    return [(a.detach(), b.detach()) for a, b in zip(ours.parameters(), theirs.parameters())]


def test_equals_torch_ddp_over_gloo():
    for pairs in md.launch(_against_ddp, P, backend="torch"):
        for a, b in pairs:
            torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def _wrapper(comm):
    hvd.init(comm)
    model = make_model()
    extra = nn.Parameter(torch.ones(2, dtype=torch.float64))  # never used: grads stay None
    base = torch.optim.SGD([*model.parameters(), extra], lr=0.1, momentum=0.9)
    named = [*model.named_parameters(), ("extra", extra)]
    opt = hvd.DistributedOptimizer(base, named_parameters=named)
    out = {"isinstance": isinstance(opt, torch.optim.SGD), "name": type(opt).__name__}
    loss_of(model, *batch(0)).backward()
    try:
        opt.zero_grad()
    except RuntimeError as e:
        out["zero_grad"] = str(e)
    opt.step()
    out["extra_grad"] = extra.grad.clone()
    sd = opt.state_dict()
    opt.load_state_dict(sd)
    out["state_keys"] = sorted(opt.state_dict()["state"])
    loss_of(model, *batch(1)).backward()
    try:
        loss_of(model, *batch(2)).backward()
    except RuntimeError as e:
        out["twice"] = str(e)
    hvd.shutdown()
    return out


def test_wrapper_is_the_optimizer_and_guards_misuse():
    for out in md.launch(_wrapper, P):
        assert out["isinstance"] and out["name"] == "SGD"
        assert "before optimizer.step() or optimizer.synchronize()" in out["zero_grad"]
        assert torch.equal(out["extra_grad"], torch.zeros(2, dtype=torch.float64))
        assert out["state_keys"] == [0, 1, 2, 3, 4]
        assert "more than backward_passes_per_step=1 times" in out["twice"]


def test_bad_arguments():
    model = make_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicate names: w"):
        hvd.DistributedOptimizer(sgd(model.parameters()), [("w", p) for _, p in named])
    with pytest.raises(ValueError, match="misses 1 of the optimizer's parameters"):
        hvd.DistributedOptimizer(sgd(model.parameters()), named[:-1])
    with pytest.raises(ValueError, match="op=hvd.Average only"):
        hvd.DistributedOptimizer(sgd(model.parameters()), named, op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be an int >= 1"):
        hvd.DistributedOptimizer(sgd(model.parameters()), named, backward_passes_per_step=0)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        hvd.DistributedOptimizer(model, named)


def _broadcasts(comm):
    """Ranks start apart (seeds, learning rates); after the two broadcasts they are rank
    0's, Adam's state (created by a zero-gradient step) included."""
    hvd.init(comm)
    torch.manual_seed(comm.rank)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).double()
    model(torch.randn(8, 4, dtype=torch.float64))  # rank-dependent running statistics
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (comm.rank + 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    hvd.shutdown()
    return model.state_dict(), state


def test_broadcast_parameters_and_optimizer_state():
    (sd0, st0), (sd1, st1) = md.launch(_broadcasts, 2)
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), k
    assert st1["param_groups"][0]["lr"] == st0["param_groups"][0]["lr"] == 0.01
    assert sorted(st0["state"]) == sorted(st1["state"]) == [0, 1, 2, 3]
    for pid in st0["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(st0["state"][pid][key], st1["state"][pid][key])
