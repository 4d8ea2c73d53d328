"""The stored tests as a notebook's test cells run them (``check``, on the kernel's own
objects): the worked solutions pass, wrong answers get feedback that names the mistake, and
the learner's code still runs only in child processes, under the test's rules."""

from __future__ import annotations

import math
import pathlib

import nbformat
import numpy as np
import pytest
import torch

import minidist as md
from minidist.grading.engine import learner, sandbox
from minidist.grading.engine.feedback import Mistake
from minidist.grading.kernel import checker
from minidist.grading.registry import EXERCISES, stored_tests

ROOT = pathlib.Path(__file__).resolve().parents[2]


def solution_namespace(name: str) -> dict:
    """Run the setup cell and the solution cells that define what the stored tests need
    (each such cell's grade_id names its function) of solutions/<name>.ipynb; return their
    globals."""
    nb = nbformat.read(str(ROOT / "solutions" / f"{name}.ipynb"), as_version=4)
    needed = {"setup"} | {n for t in stored_tests(name).values() for n in t.needs}
    ns: dict = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade_id") in needed:
            exec(compile(cell.source, f"<{meta['grade_id']}>", "exec"), ns)
    return ns


def feedback(exercise: str, grade_id: str, fn) -> str:
    with pytest.raises(Mistake) as info:
        checker(exercise)(grade_id, fn)
    return str(info.value)


@pytest.fixture
def quick_deadlocks(monkeypatch):
    monkeypatch.setattr(learner, "COMM_TIMEOUT", 2.0)


@pytest.mark.parametrize("name", list(EXERCISES))
def test_worked_solutions_pass_every_stored_test(name, capsys):
    dtype = torch.get_default_dtype()  # a notebook may set it for its own kernel (05 does)
    try:
        ns, check = solution_namespace(name), checker(name)
        for test in stored_tests(name).values():
            check(test.grade_id, *[ns[n] for n in test.needs])
            score = f"{test.points}/{test.points} points" if test.points else "practice, no points"
            assert f"{test.grade_id}: passed, {score}" in capsys.readouterr().out
    finally:
        torch.set_default_dtype(dtype)


def test_check_wants_what_the_test_needs():
    with pytest.raises(TypeError, match="takes ring_shift"):
        checker("00_getting_started")("test_ring_shift")
    with pytest.raises(KeyError, match="no test 'test_nothing'"):
        checker("00_getting_started")("test_nothing", print)


# -- exercise 00 ----------------------------------------------------------------------------
def recv_first_shift(comm, t):
    out = torch.empty_like(t)
    comm.recv(out, (comm.rank - 1) % comm.world_size)
    comm.send(t, (comm.rank + 1) % comm.world_size)
    return out


def backwards_shift(comm, t):
    out = torch.empty_like(t)
    p = comm.world_size
    req = comm.irecv(out, (comm.rank + 1) % p)
    comm.send(t, (comm.rank - 1) % p)
    req.wait()
    return out


def round_trip_ping_pong(comm, nbytes, iters):
    import time

    comm.barrier()
    buf, start = torch.zeros(nbytes, dtype=torch.uint8), time.perf_counter()
    for _ in range(iters if comm.rank < 2 else 0):
        if comm.rank == 0:
            comm.send(buf, 1)
            comm.recv(buf, 1)
        else:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    return (time.perf_counter() - start) / iters


def plain_least_squares(sizes, seconds):
    a = np.stack([np.ones(len(sizes)), np.asarray(sizes, dtype=float)], axis=1)
    (alpha, slope), *_ = np.linalg.lstsq(a, np.asarray(seconds), rcond=None)
    return float(alpha), float(1 / slope)


def test_feedback_for_exercise_00(quick_deadlocks):
    text = feedback("00_getting_started", "test_ring_shift", recv_first_shift)
    assert text.startswith("deadlock in ring_shift at `comm.recv(out, (comm.rank - 1) % "
                           "comm.world_size)` (world_size=2, n=1, dtype=float32): rank 0 waits "
                           "in recv from rank 1; rank 1 waits in recv from rank 0"), text
    text = feedback("00_getting_started", "test_ring_shift", backwards_shift)
    assert "that is the tensor of rank 1" in text and "left neighbour" in text
    text = feedback("00_getting_started", "test_ping_pong", round_trip_ping_pong)
    assert "that is the round trip" in text
    text = feedback("00_getting_started", "test_fit_alpha_beta", plain_least_squares)
    assert "relative error" in text


# -- exercise 01 ----------------------------------------------------------------------------
def everyone_to_everyone(comm, t):
    others = [r for r in range(comm.world_size) if r != comm.rank]
    bufs = [torch.empty_like(t) for _ in others]
    reqs = [comm.irecv(b, r) for b, r in zip(bufs, others)]
    for r in others:
        comm.send(t, r)
    for req, b in zip(reqs, bufs):
        req.wait()
        t += b
    return t


def wrong_owner_reduce_scatter(comm, chunks):
    p, r = comm.world_size, comm.rank
    for s in range(p - 1):
        send_i, recv_i = (r - s) % p, (r - s - 1) % p
        got = torch.empty_like(chunks[recv_i])
        comm.sendrecv(chunks[send_i], (r + 1) % p, got, (r - 1) % p)
        chunks[recv_i] += got


def library_all_reduce(comm, t):
    return md.all_reduce(comm, t, algorithm="ring")


def test_feedback_for_exercise_01():
    text = feedback("01_collectives", "test_naive_all_reduce", everyone_to_everyone)
    assert "rank 1 sent 28 bytes to rank 0, 28 bytes to rank 2" in text
    text = feedback("01_collectives", "test_ring_all_reduce", everyone_to_everyone)
    # on 2 ranks its bytes are a ring's (the whole tensor once): the count of messages is not
    assert "rank 0 sent 1 message(s), 28 bytes to rank 1; a ring all_reduce sends one " \
        "chunk per step, 2(p-1) = 2 messages" in text
    text = feedback("01_collectives", "test_ring_reduce_scatter", wrong_owner_reduce_scatter)
    assert "rank 0: 4 of 4 values wrong" in text and "missing rank(s) [1]" in text
    text = feedback("01_collectives", "test_ring_all_reduce", library_all_reduce)
    assert "minidist.collectives.api.all_reduce is not allowed in this exercise" in text
    assert sandbox.unwrapped(md.all_reduce).__code__.co_name == "all_reduce"  # child only


# -- exercise 02 ----------------------------------------------------------------------------
def contiguous_shards(n, rank, world_size, shuffle=True, seed=0, epoch=0):
    per = math.ceil(n / world_size)
    idx = list(range(n)) * 2
    return idx[rank * per:(rank + 1) * per]


def summed_gradient_hooks(model, comm):
    def add_up(param):
        md.all_reduce(comm, param.grad, op="sum")

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(add_up)


def forward_buckets(sizes, cap):
    buckets, current, filled = [], [], 0
    for i, size in enumerate(sizes):
        current.append(i)
        filled += size
        if filled >= cap:
            buckets.append(current)
            current, filled = [], 0
    return buckets + ([current] if current else [])


def test_feedback_for_exercise_02():
    text = feedback("02_data_parallel", "test_shard_indices", contiguous_shards)
    assert "rank 0 got [0, 1, 2, 3], expected [0, 3, 6, 9]" in text
    assert "indices[rank::world_size]" in text
    text = feedback("02_data_parallel", "test_register_allreduce_hooks", summed_gradient_hooks)
    assert "2 times too large" in text and "divide by world_size" in text
    text = feedback("02_data_parallel", "test_assign_buckets", forward_buckets)
    assert "fill buckets in reverse order" in text


# -- exercise 05 ----------------------------------------------------------------------------
class IdentityBothWays(torch.autograd.Function):  # f without its all-reduce
    @staticmethod
    def forward(ctx, x, comm):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class SumForward(torch.autograd.Function):  # a right g
    @staticmethod
    def forward(ctx, x, comm):
        return md.all_reduce(comm, x.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def bias_on_every_rank_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, comm):
    linear, gelu = torch.nn.functional.linear, torch.nn.functional.gelu
    hidden = gelu(linear(x, fc_weight, fc_bias))
    return SumForward.apply(linear(hidden, proj_weight, proj_bias), comm)


def library_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, comm):
    from minidist.parallel.tensor import copy_to_parallel
    return copy_to_parallel(x, comm)


def test_feedback_for_exercise_05():
    text = feedback("05_tensor_parallel", "test_copy_to_parallel", IdentityBothWays)
    assert "with world_size=2: rank 0: the gradient of x" in text
    assert "missing the all-reduce in backward" in text
    text = feedback("05_tensor_parallel", "test_reduce_from_parallel", IdentityBothWays)
    assert "it is this rank's own partial sum" in text
    text = feedback("05_tensor_parallel", "test_parallel_mlp", bias_on_every_rank_mlp)
    assert "c_proj's bias was added on every rank before the all-reduce" in text
    text = feedback("05_tensor_parallel", "test_parallel_mlp", library_mlp)
    assert "minidist.parallel.tensor.mappings.copy_to_parallel is not allowed" in text
    # only the children were changed: the library still works here
    from minidist.parallel.tensor import mappings
    assert mappings.copy_to_parallel.__code__.co_name == "copy_to_parallel"
    assert md.ColumnParallelLinear.from_full.__func__.__name__ == "from_full"


# -- exercise 03 ----------------------------------------------------------------------------
def summing_sync_step(comm, params, lr):
    grad, total = torch.empty_like(params), torch.zeros_like(params)
    for _ in range(comm.world_size - 1):
        comm.recv(grad, md.ANY_SOURCE)
        total += grad
    params -= lr * total
    for w in range(1, comm.world_size):
        comm.send(params, w)


def ahead_of_the_fastest(clock, clocks, staleness):
    return max(clocks) - clock <= staleness


def test_feedback_for_exercise_03():
    text = feedback("03_parameter_server", "test_sync_step", summing_sync_step)
    assert text.startswith("with world_size=3 (the server and 2 worker(s)), 3 steps: sync_step "
                           "broke the protocol at `comm.send(params, w)`"), text
    assert "the sum of the 2 gradients, 2 times the average" in text
    text = feedback("03_parameter_server", "test_ssp_admits", ahead_of_the_fastest)
    assert "with clock=1, clocks=[1, 0, 1], staleness=0: ssp_admits returned True" in text
    assert "ahead of the slowest: c - min(clocks) <= s" in text


# -- exercise 04 ----------------------------------------------------------------------------
def gpipe_order(rank, stages, microbatches):
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


def warm_up_by_rank(rank, stages, microbatches):
    warmup = min(rank, microbatches)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, microbatches):
        actions += [("F", i), ("B", i - warmup)]
    return actions + [("B", i) for i in range(microbatches - warmup, microbatches)]


def forward_to_the_wrong_stage(comm, module, x, pending):
    r, p = comm.rank, comm.world_size
    if r > 0:
        comm.recv(x, r - 1)
        x.requires_grad_()
    out = module(x)
    if r < p - 1:  # stage 1 sends back, the others forward
        pending.append(comm.isend(out.detach(), r - 1 if r == 1 else r + 1))
    return x, out


def test_feedback_for_exercise_04(quick_deadlocks):
    text = feedback("04_pipeline_parallel", "test_one_f_one_b", gpipe_order)
    assert text.startswith("with stages=4, microbatches=8: stage 0 holds 5 micro-batches in "
                           "flight at its list[4]"), text
    assert "where the bound is p - r = 4: it runs every forward before its first backward, "\
        "as GPipe does" in text
    text = feedback("04_pipeline_parallel", "test_one_f_one_b", warm_up_by_rank)
    assert "deadlock between stages 0 and 1: stage 0 waits at its list[1] = ('B', 0) for " \
        "micro-batch 0's gradient, which stage 1 sends only at its list[2]" in text, text
    text = feedback("04_pipeline_parallel", "test_forward_step", forward_to_the_wrong_stage)
    assert "forward_step sends to rank 0: the activation goes forward, to the next stage, " \
        "rank 2" in text, text


def test_exercise_04_reference_is_the_library_schedule():
    from minidist.grading.exercises.ex04_pipeline_parallel.ranks import (
        reference_1f1b,
        reference_gpipe,
    )
    from minidist.grading.exercises.ex04_pipeline_parallel.schedule import CASES, schedule_problem

    for p, m in CASES:
        assert [reference_1f1b(r, p, m) for r in range(p)] == md.pipeline.actions("1f1b", p, m)
        assert [reference_gpipe(r, p, m) for r in range(p)] == md.pipeline.actions("gpipe", p, m)
        assert schedule_problem(md.pipeline.actions("1f1b", p, m), m) is None
        report = md.pipeline.simulate(md.pipeline.actions("1f1b", p, m))
        assert report.ok and report.in_flight == [min(p - r, m) for r in range(p)]


# -- exercise 06 ----------------------------------------------------------------------------
def drifting_step(comm, params, grad, state, make_optimizer):
    """Stage 1 right, except that rank 1's copy drifts at index 7 after the gather."""
    p, n = comm.world_size, params.numel()
    s = -(-n // p)
    if not state:
        flat = torch.zeros(s * p, dtype=params.dtype)
        flat[:n] = params
        state["shard"] = torch.nn.Parameter(flat[comm.rank * s:(comm.rank + 1) * s].clone())
        state["opt"] = make_optimizer([state["shard"]])
    g = torch.zeros(s * p, dtype=grad.dtype)
    g[:n] = grad
    state["shard"].grad = md.reduce_scatter(comm, g, op="avg")
    state["opt"].step()
    params.copy_(md.all_gather(comm, state["shard"].detach()).reshape(-1)[:n])
    if comm.rank == 1 and n > 7:
        params[7] += 0.5


def tensor_split_bounds(numel, rank, world_size):
    pieces = torch.arange(numel).tensor_split(world_size)
    start = sum(len(x) for x in pieces[:rank])
    return start, start + len(pieces[rank])


def test_feedback_for_exercise_06():
    text = feedback("06_zero_sharding", "test_zero1_step", drifting_step)
    assert text.startswith("with world_size=4, 10 parameters, SGD with momentum 0.9: after "
                           "step 1, the gathered parameters differ across ranks at index 7: "
                           "rank 0 has"), text
    text = feedback("06_zero_sharding", "test_shard_bounds", tensor_split_bounds)
    assert "the shard boundaries ignore padding: with 10 elements on 4 ranks each shard is 3 " \
        "(2 padding elements on rank 3). Your shards hold [3, 3, 2, 2] elements" in text, text


def test_exercise_06_reference_is_the_library_layout():
    from minidist.grading.exercises.ex06_zero_sharding.checks import BOUNDS_CASES
    from minidist.grading.exercises.ex06_zero_sharding.ranks import optimizer_problem, padding_text
    from minidist.parallel.zero import FlatShards

    for n, p in BOUNDS_CASES:
        for r in range(p):
            group = FlatShards([torch.nn.Parameter(torch.zeros(n))], p, r)
            s = group.shard_numel
            assert group.bounds() == (r * s, (r + 1) * s) and group.padded == s * p
    assert padding_text(5, 4) == ("with 5 elements on 4 ranks each shard is 2 (3 padding "
                                  "elements: 1 on rank 2, 2 on rank 3)")
    assert optimizer_problem([10], 3, 10, 4, 1).startswith(
        "rank 1 updated the full tensor (its optimizer state holds 10 elements, its shard is 3)")
    assert optimizer_problem([3], 3, 10, 4, 1) is None


# -- exercise 07 ----------------------------------------------------------------------------
def first_dimension_fastest(rank, shape):
    out, stride = {}, 1
    for name in shape:
        out[name] = rank // stride % shape[name]
        stride *= shape[name]
    return out


def tp_groups_by_the_other_coordinates(comm, shape):  # color = the tp coordinate: swapped
    groups = {}
    for name in shape:
        coords = first_dimension_fastest(comm.rank, dict(reversed(list(shape.items()))))
        groups[name] = comm.split(color=coords[name], key=comm.rank)
    return groups


def test_feedback_for_exercise_07():
    text = feedback("07_hybrid_parallelism", "test_mesh_coords", first_dimension_fastest)
    assert text.startswith("with rank=1, shape={'dp': 2, 'pp': 2, 'tp': 2}: mesh_coords "
                           "returned {'dp': 1, 'pp': 0, 'tp': 0}, expected {'dp': 0, 'pp': 0, "
                           "'tp': 1}; that is a mesh with the FIRST dimension fastest"), text
    text = feedback("07_hybrid_parallelism", "test_mesh_groups",
                    tp_groups_by_the_other_coordinates)
    assert "the dp group of rank 0 holds ranks [0, 1, 2, 3] where it should hold [0, 4]: " \
        "those are the ranks whose dp coordinate equals rank 0's" in text, text


def test_exercise_07_reference_is_torch_layout_and_the_library_mesh():
    from minidist.grading.exercises.ex07_hybrid_parallelism.checks import (
        COORD_SHAPES,
        GROUP_CASES,
        SYNC_CASES,
    )
    from minidist.grading.exercises.ex07_hybrid_parallelism.ranks import (
        reference_coords,
        reference_groups,
    )
    from minidist.parallel import mesh

    shapes = COORD_SHAPES + [s for cases in (GROUP_CASES, SYNC_CASES)
                             for shape in cases.values() for s in shape]
    for shape in shapes:
        world = math.prod(shape.values())
        for rank in range(world):
            assert reference_coords(rank, shape) == mesh.coords_of(rank, shape)
        for name in shape:
            assert sorted(reference_groups(shape, name)) == mesh.groups(shape, name)
            # torch's DeviceMesh: one group per row of mesh.swapdims(-1, d).reshape(-1, n)
            d, grid = list(shape).index(name), np.arange(world).reshape(*shape.values())
            rows = np.swapaxes(grid, -1, d).reshape(-1, shape[name]).tolist()
            assert reference_groups(shape, name) == rows


# -- exercise 08 ----------------------------------------------------------------------------
def early_update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                       growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker + 1 >= growth_interval - 1:  # one clean step too few
        return scale * growth_factor, 0
    return scale, growth_tracker + 1


def local_scaled_step(comm, optimizer, state):  # found_inf never leaves the rank
    grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
    found_inf = any(not torch.isfinite(g).all() for g in grads)
    if not found_inf:
        for g in grads:
            g.div_(state["scale"])
        optimizer.step()
    state["scale"], state["growth_tracker"] = (
        (state["scale"] * 0.5, 0) if found_inf else
        (state["scale"] * 2, 0) if state["growth_tracker"] + 1 == state["growth_interval"] else
        (state["scale"], state["growth_tracker"] + 1))
    return not found_inf


def test_feedback_for_exercise_08():
    text = feedback("08_mixed_precision", "test_update_scale", early_update_scale)
    assert "at step 1998 (found_inf=False, going in with scale=65536, tracker=1998) your update " \
        "returned (scale=131072, tracker=0), torch's GradScaler (scale=65536, tracker=1999): " \
        "grew after 1999 clean steps (growth_interval=2000): the tracker must reach " \
        "growth_interval" in text, text
    text = feedback("08_mixed_precision", "test_scaled_step", local_scaled_step)
    assert text.startswith("ranks disagreed on skipping at step 3: rank 1 skipped, rank 0 "
                           "stepped (only rank 1's gradients held inf, world_size=2)"), text


def test_exercise_08_reference_is_torch_and_the_library_schedule():
    from minidist.grading.exercises.ex08_mixed_precision.ranks import SCHEDULE_CASES, torch_schedule
    from minidist.parallel.amp import next_scale

    for _, init, growth, backoff, interval, flags in SCHEDULE_CASES[1:]:
        scale, tracker, ours = init, 0, []
        for flag in flags:
            scale, tracker = next_scale(scale, tracker, bool(flag), growth, backoff, interval)
            ours.append((scale, tracker))
        assert ours == torch_schedule(init, growth, backoff, interval, flags)
