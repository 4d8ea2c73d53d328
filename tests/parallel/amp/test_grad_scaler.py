"""md.GradScaler follows torch.amp.GradScaler step for step, and with ``comm`` every rank
skips the same steps.

Equivalence is exact (bitwise): both scalers see the same gradients, multiply by the same
float32 1/S and move S by the same float32 products, so scale, growth tracker, skipped steps
and parameters must be identical, not merely close.
"""

from __future__ import annotations

import pytest
import torch

import minidist as md
from minidist.parallel.amp import agreement_cost, next_scale

INF_STEPS = {7, 8, 19}  # forced overflows on top of the natural ones (scale x 2 > fp16 max)


def _model() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.25]))


def _loss(w: torch.Tensor, step: int) -> torch.Tensor:
    """The product runs in float16, so the gradient S * c overflows once S * 2 > 65504:
    the scale overflows naturally after each growth, and ``INF_STEPS`` add an inf."""
    c = torch.tensor([2.0, 1.0, -0.5, 1e-3], dtype=torch.float16)
    if step in INF_STEPS:
        c[step % 4] = float("inf")
    return (w.half() * c).float().sum()


def _trace(scaler, steps: int, momentum: float, clip: bool = False) -> list[tuple]:
    w = _model()
    opt = torch.optim.SGD([w], lr=1e-3, momentum=momentum)
    out = []
    for step in range(steps):
        scaler.scale(_loss(w, step)).backward()
        if clip:  # unscale_ first, then clip the true gradients (torch's documented recipe)
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([w], max_norm=0.5)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        out.append((scaler.get_scale(), scaler.state_dict()["_growth_tracker"],
                    w.detach().clone()))
    return out


@pytest.mark.parametrize("growth_interval,momentum,clip", [(3, 0.0, False), (4, 0.9, False),
                                                            (1, 0.5, False), (3, 0.9, True)])
def test_matches_torch_step_by_step(growth_interval, momentum, clip):
    kw = dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
              growth_interval=growth_interval)
    ours = _trace(md.GradScaler(**kw), 30, momentum, clip)
    want = _trace(torch.amp.GradScaler("cpu", **kw), 30, momentum, clip)
    scales = [s for s, _, _ in ours]
    assert len(set(scales)) >= 3, "the sequence should back off and grow"
    for step, ((s, t, w), (ws, wt, ww)) in enumerate(zip(ours, want)):
        assert (s, t) == (ws, wt), f"step {step}: scale/tracker {(s, t)} != torch {(ws, wt)}"
        assert torch.equal(w, ww), f"step {step}: parameters differ from torch's"


def test_other_factors_match_torch():
    kw = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=2)
    ours, want = _trace(md.GradScaler(**kw), 25, 0.0), _trace(torch.amp.GradScaler("cpu", **kw),
                                                              25, 0.0)
    assert [(s, t) for s, t, _ in ours] == [(s, t) for s, t, _ in want]


def _cheap_steps(scaler, n: int, bad: set[int]) -> list[float]:
    """``n`` steps on a hand-set gradient (no autograd): the default growth_interval, fast."""
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=0.0)
    scales = []
    for step in range(n):
        scaler.scale(torch.tensor(1.0))  # both scalers insist on a scale() per run
        w.grad = torch.tensor([float("nan") if step in bad else 1.0, 2.0])
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def test_default_growth_interval_2000_exactly():
    ours = _cheap_steps(md.GradScaler(), 4100, bad={3})
    want = _cheap_steps(torch.amp.GradScaler("cpu"), 4100, bad={3})
    assert ours == want
    # backoff at step 3, then 2000 clean steps (4 .. 2003): grows after step 2003, not 2002
    assert ours[3] == 2.0**15 and ours[2002] == 2.0**15 and ours[2003] == 2.0**16
    assert ours[4002] == 2.0**16 and ours[4003] == 2.0**17


def test_next_scale_is_the_schedule():
    assert next_scale(8.0, 0, True, 2.0, 0.5, 3) == (4.0, 0)
    assert next_scale(8.0, 1, False, 2.0, 0.5, 3) == (8.0, 2)
    assert next_scale(8.0, 2, False, 2.0, 0.5, 3) == (16.0, 0)
    big = float(torch.finfo(torch.float32).max)
    assert next_scale(big, 0, False, 2.0, 0.5, 1) == (big, 0)  # growth to inf is refused


def test_state_dict_round_trip_and_skipped_steps():
    scaler = md.GradScaler(growth_interval=3)
    _trace(scaler, 12, 0.0)
    assert scaler.skipped_steps >= 2
    state = scaler.state_dict()
    assert set(state) == set(torch.amp.GradScaler("cpu").state_dict())
    other = md.GradScaler()
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert _trace(other, 6, 0.0)[-1][:2] == _trace(scaler, 6, 0.0)[-1][:2]


def test_disabled_is_a_no_op():
    scaler = md.GradScaler(enabled=False)
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    assert scaler.state_dict() == {}


def test_bad_input_and_misuse_raise_clear_errors():
    with pytest.raises(ValueError, match="growth_factor"):
        md.GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        md.GradScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        md.GradScaler(growth_interval=0)
    with pytest.raises(ValueError, match="init_scale"):
        md.GradScaler(init_scale=-1.0)
    with pytest.raises(TypeError, match="comm"):
        md.GradScaler(comm="world")
    scaler = md.GradScaler()
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    with pytest.raises(AssertionError, match="No inf checks"):
        scaler.update()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    w16 = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    w16.grad = torch.ones(2, dtype=torch.float16)
    fresh = md.GradScaler()
    fresh.scale(w16.sum())
    with pytest.raises(ValueError, match="FP16 gradients.*master weights"):
        fresh.unscale_(torch.optim.SGD([w16], lr=0.1))
    with pytest.raises(ValueError, match="Tensor"):
        scaler.scale("loss")


# -- found_inf agreement across ranks ----------------------------------------------------------
def _sharded_rank(comm, agree: bool):
    """Each rank owns its own slice of the model (as a ZeRO shard or a tensor-parallel slice
    does); at step s == rank + 2 only this rank's gradient overflows."""
    torch.manual_seed(comm.rank)
    w = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = md.GradScaler(comm=comm if agree else None, growth_interval=2)
    scales, stepped = [], []
    for step in range(8):
        before = w.detach().clone()
        c = torch.ones(3) * (float("inf") if step == comm.rank + 2 else 1.0)
        scaler.scale((w * c).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        stepped.append(not torch.equal(before, w.detach()))
    return scales, stepped


@pytest.mark.parametrize("world_size,backend", [(2, "local"), (3, "local"), (4, "local"),
                                                (2, "torch")])
def test_one_rank_overflows_every_rank_skips(world_size, backend):
    agreed = md.launch(_sharded_rank, world_size, args=(True,), backend=backend, timeout=60)
    for rank in range(world_size):
        assert agreed[rank] == agreed[0], f"rank {rank} disagrees with rank 0"
    scales, stepped = agreed[0]
    overflow_steps = set(range(2, 2 + world_size))
    assert [not s for s in stepped] == [s in overflow_steps for s in range(8)]


def test_without_comm_the_ranks_diverge():
    alone = md.launch(_sharded_rank, 2, args=(False,), timeout=60)
    (scales0, stepped0), (scales1, stepped1) = alone[0], alone[1]
    assert stepped0[2] is False and stepped1[2] is True  # rank 1 stepped on a bad step
    assert scales0 != scales1  # and from then on the ranks scale their losses differently


def _mesh_rank(comm):
    mesh = md.DeviceMesh(comm, {"dp": 2, "tp": 2})
    scaler = md.GradScaler(comm=mesh)
    assert len(scaler.comms) == 2
    return scaler.agree(comm.rank == 3), md.GradScaler(comm=[mesh["tp"]]).agree(comm.rank == 3)


def test_agreement_cost_is_latency_bound():
    # ceil(lg 2) + ceil(lg 4) = 3 rounds of alpha + 4 beta; a 1-rank group costs nothing
    assert agreement_cost([2, 4, 1], alpha=1e-5, beta=1e-9) == pytest.approx(3 * (1e-5 + 4e-9))


def test_mesh_agreement_covers_every_dimension():
    out = md.launch(_mesh_rank, 4, timeout=60)
    assert [o[0] for o in out] == [True] * 4
    assert [o[1] for o in out] == [False, False, True, True]  # tp group (2, 3) only
