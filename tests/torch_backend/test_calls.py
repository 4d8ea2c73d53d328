"""Every torch.distributed call over minidist, against what the call means (computed
from every rank's input here) and against gloo on the same inputs.

One launch runs all the cases on each world size (a launch with torch costs a second);
each case returns its outputs, and the test compares them by name.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import minidist as md


def _x(r: int, n: int = 5, dtype=torch.float64) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float64) * (r + 1) + r).to(dtype)


def _cases(comm, backend: str) -> dict:
    """Every call once (several forms of some); the outputs by name."""
    if backend == "minidist":
        md.torch_backend.init_process_group(comm)
    r, p, out = dist.get_rank(), dist.get_world_size(), {}
    for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        if backend == "gloo" and op == "AVG":
            continue  # gloo has no AVG
        t = _x(r)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = t
    ts = [_x(r, 3), _x(r, 4)]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = torch.cat(ts)
    t = _x(r)
    dist.broadcast(t, src=p - 1)
    out["broadcast"] = t
    t = _x(r)
    dist.reduce(t, dst=1, op=dist.ReduceOp.SUM)
    out["reduce"] = t if r == 1 else torch.empty(0)
    lst = [torch.empty(5, dtype=torch.float64) for _ in range(p)]
    dist.all_gather(lst, _x(r))
    out["all_gather"] = torch.stack(lst)
    if backend == "minidist":  # gloo refuses uneven all_gather lists
        lst = [torch.empty(k + 1, dtype=torch.float64) for k in range(p)]
        dist.all_gather(lst, _x(r, r + 1))
        out["all_gather_uneven"] = torch.cat(lst)
    o = torch.empty(5 * p, dtype=torch.float64)
    dist.all_gather_into_tensor(o, _x(r))
    out["all_gather_into_tensor"] = o
    outs = [[torch.empty(3, dtype=torch.float64), torch.empty(2, dtype=torch.float64)]
            for _ in range(p)]  # one list per rank, one tensor per input
    dist.all_gather_coalesced(outs, [_x(r, 3), _x(r, 2)])
    out["all_gather_coalesced"] = torch.cat([torch.cat(o) for o in outs])
    o = torch.empty(3, dtype=torch.float64)
    dist.reduce_scatter(o, [_x(r + k, 3) for k in range(p)])
    out["reduce_scatter"] = o
    o = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(o, _x(r, 2 * p))
    out["reduce_scatter_tensor"] = o
    with dist._coalescing_manager(async_ops=True) as cm:  # FSDP's coalesced all-gather
        o1, o2 = torch.empty(2 * p, dtype=torch.float64), torch.empty(3 * p, dtype=torch.float64)
        dist.all_gather_into_tensor(o1, _x(r, 2), async_op=True)
        dist.all_gather_into_tensor(o2, _x(r, 3), async_op=True)
    cm.wait()
    out["all_gather_into_tensor_coalesced"] = torch.cat([o1, o2])
    g = [torch.empty(5, dtype=torch.float64) for _ in range(p)] if r == 0 else None
    dist.gather(_x(r), g, dst=0)
    out["gather"] = torch.stack(g) if g else torch.empty(0)
    s = torch.empty(4, dtype=torch.float64)
    dist.scatter(s, [_x(k, 4) for k in range(p)] if r == p - 1 else None, src=p - 1)
    out["scatter"] = s
    o = torch.empty(2 * p, dtype=torch.float64)
    dist.all_to_all_single(o, _x(r, 2 * p))
    out["all_to_all_single"] = o
    sizes_in = [(r + k) % 3 for k in range(p)]  # rank r sends (r + k) % 3 rows to rank k
    sizes_out = [(k + r) % 3 for k in range(p)]
    o = torch.empty(sum(sizes_out), 2, dtype=torch.float64)
    dist.all_to_all_single(o, _x(r, 2 * sum(sizes_in)).view(-1, 2), sizes_out, sizes_in)
    out["all_to_all_single_uneven"] = o.reshape(-1)
    outs = [torch.empty(2, dtype=torch.float64) for k in range(p)]
    dist.all_to_all(outs, [_x(r, 2) + k for k in range(p)])
    out["all_to_all"] = torch.cat(outs)
    if backend == "minidist":  # gloo refuses pieces of different sizes here
        outs = [torch.empty(r + 1, dtype=torch.float64) for k in range(p)]  # r+1 from each
        dist.all_to_all(outs, [_x(r, k + 1) + r for k in range(p)])  # k+1 to rank k
        out["all_to_all_uneven"] = torch.cat(outs)
    dist.barrier()
    out.update(_p2p(r, p))
    out.update(_objects(r, p))
    out.update(_subgroup(r, p))
    dist.destroy_process_group()
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def _p2p(r: int, p: int) -> dict:
    out = {}
    right, left = (r + 1) % p, (r - 1) % p
    got = torch.empty(3, dtype=torch.float64)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, _x(r, 3), right),
                                   dist.P2POp(dist.irecv, got, left)])
    for req in reqs:
        req.wait()
    out["batch_isend_irecv"] = got
    if r == 0:  # rank 0 takes one message from each other rank, from any source
        seen = []
        for _ in range(p - 1):
            t = torch.empty(2, dtype=torch.float64)
            src = dist.recv(t, tag=7)
            seen.append((src, t))
        out["recv_any"] = torch.stack([t for _, t in sorted(seen, key=lambda s: s[0])])
        out["recv_any_sources"] = sorted(s for s, _ in seen)
    else:
        dist.send(_x(r, 2), dst=0, tag=7)
    return out


def _objects(r: int, p: int) -> dict:
    objs = [None] * p
    dist.all_gather_object(objs, {"rank": r, "name": f"r{r}"})
    lst = [{"hello": list(range(r + 3))}] if r == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    gathered = [None] * p if r == 0 else None
    dist.gather_object(("g", r), gathered, dst=0)
    got = [None]
    dist.scatter_object_list(got, [f"s{k}" for k in range(p)] if r == 0 else None, src=0)
    return {"all_gather_object": objs, "broadcast_object_list": lst,
            "gather_object": gathered, "scatter_object_list": got}


def _subgroup(r: int, p: int) -> dict:
    """new_group over the odd ranks: an all_reduce and a broadcast inside it only."""
    odd = [k for k in range(p) if k % 2 == 1]
    group = dist.new_group(odd)
    t = _x(r)
    if r in odd:
        dist.all_reduce(t, group=group)
        dist.broadcast(t, src=odd[-1], group=group)
    return {"subgroup": t}


def _expected(p: int) -> dict:
    xs = [_x(r) for r in range(p)]
    stack = torch.stack(xs)
    e = {"all_reduce_SUM": stack.sum(0), "all_reduce_AVG": stack.sum(0) / p,
         "all_reduce_MAX": stack.max(0).values, "all_reduce_MIN": stack.min(0).values,
         "all_reduce_PRODUCT": stack.prod(0), "broadcast": xs[p - 1],
         "all_gather": stack, "all_gather_into_tensor": stack.reshape(-1),
         "gather": stack}
    e["all_reduce_coalesced"] = torch.cat([sum(_x(r, 3) for r in range(p)),
                                           sum(_x(r, 4) for r in range(p))])
    e["all_gather_uneven"] = torch.cat([_x(k, k + 1) for k in range(p)])
    e["all_gather_coalesced"] = torch.cat([torch.cat([_x(k, 3), _x(k, 2)]) for k in range(p)])
    e["all_gather_into_tensor_coalesced"] = torch.cat(
        [torch.cat([_x(k, 2) for k in range(p)]), torch.cat([_x(k, 3) for k in range(p)])])
    e["recv_any_sources"] = list(range(1, p))
    e["recv_any"] = torch.stack([_x(k, 2) for k in range(1, p)])
    e["all_gather_object"] = [{"rank": k, "name": f"r{k}"} for k in range(p)]
    e["broadcast_object_list"] = [{"hello": [0, 1, 2]}]
    e["gather_object"] = [("g", k) for k in range(p)]
    return e


def _per_rank(r: int, p: int) -> dict:
    """What rank r should hold, for the calls whose answer differs by rank."""
    e = {"reduce_scatter": sum(_x(k + r, 3) for k in range(p)),
         "reduce_scatter_tensor": sum(_x(k, 2 * p) for k in range(p))[2 * r:2 * r + 2],
         "all_to_all_single": torch.stack([_x(k, 2 * p)[2 * r:2 * r + 2] for k in range(p)])
         .reshape(-1),
         "all_to_all": torch.cat([_x(k, 2) + r for k in range(p)]),
         "all_to_all_uneven": torch.cat([_x(k, r + 1) + k for k in range(p)]),
         "batch_isend_irecv": _x((r - 1) % p, 3), "scatter_object_list": [f"s{r}"],
         "scatter": _x(r, 4)}
    rows = []
    for k in range(p):  # rank k's rows for rank r start after what k sends to ranks < r
        start = sum((k + j) % 3 for j in range(r))
        rows.append(_x(k, 2 * sum((k + j) % 3 for j in range(p))).view(-1, 2)
                    [start:start + (k + r) % 3])
    e["all_to_all_single_uneven"] = torch.cat(rows).reshape(-1)
    e["reduce"] = sum(_x(k) for k in range(p)) if r == 1 else torch.empty(0)
    odd = [k for k in range(p) if k % 2 == 1]
    e["subgroup"] = sum(_x(k) for k in odd) if r in odd else _x(r)
    return e


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return got.shape == want.shape and torch.allclose(got.double(), want.double(),
                                                          rtol=0, atol=1e-12)
    return got == want


@pytest.mark.parametrize("p", [2, 3, 4])
def test_every_call_means_what_torch_says(p):
    ranks = md.launch(_cases, p, args=("minidist",), timeout=60)
    common = _expected(p)
    for r, got in enumerate(ranks):
        want = dict(common, **_per_rank(r, p))
        if r != 0:
            for k in ("gather", "recv_any", "recv_any_sources", "gather_object"):
                want.pop(k)
            want["gather"] = torch.empty(0)
        missing = set(want) - set(got)
        assert not missing, missing
        wrong = [k for k in want if not _same(got[k], want[k])]
        assert not wrong, f"rank {r} of {p}: {wrong}"


def test_equals_gloo_on_the_same_calls():
    ours = md.launch(_cases, 4, args=("minidist",), timeout=60)
    gloo = md.launch(_cases, 4, args=("gloo",), backend="torch", timeout=60)
    for r in range(4):
        for k, want in gloo[r].items():
            assert _same(ours[r][k], want), f"rank {r}: {k}"
