"""Exercise 07's reference mesh and what runs on each rank of its launched tests.

The reference is torch's own arithmetic: ``init_device_mesh`` lays the ranks out as
``torch.arange(world).reshape(sizes)`` (row-major, the last dimension fastest) and makes one
group per row of ``mesh.swapdims(-1, d).reshape(-1, size_d)`` along dimension d (torch's
``DeviceMesh._init_process_groups``). It is the grader's own, independent of
``md.DeviceMesh``, which is out of reach while the tests run (the sandbox's ``MESH`` rule).

On each rank, :func:`groups_case` calls the learner's ``mesh_groups`` and has every group it
returned all-reduce a one-hot vector of the global rank: the sum says which ranks the group
really holds. :func:`sync_case` hands the learner's ``sync_gradients`` groups built by the
grader and gradients whose every value says which rank it came from (``engine.data.pattern``).
"""

from __future__ import annotations

import torch

from ....collectives import all_reduce
from ....comm import Communicator
from ...engine.calls import record_collectives
from ...engine.data import pattern

Shape = dict[str, int]


def reference_mesh(shape: Shape) -> torch.Tensor:
    """The ranks as torch's ``init_device_mesh`` lays them out: C order, last dim fastest."""
    world = 1
    for size in shape.values():
        world *= size
    return torch.arange(world).reshape(tuple(shape.values()))


def reference_coords(rank: int, shape: Shape) -> dict[str, int]:
    where = (reference_mesh(shape) == rank).nonzero()[0].tolist()
    return dict(zip(shape, where))


def reference_groups(shape: Shape, name: str) -> list[list[int]]:
    """Every group along dimension ``name``, each ordered by its coordinate (torch's rule)."""
    mesh, d = reference_mesh(shape), list(shape).index(name)
    return mesh.swapdims(-1, d).reshape(-1, shape[name]).tolist()


def reference_group(rank: int, shape: Shape, name: str) -> list[int]:
    return next(g for g in reference_groups(shape, name) if rank in g)


def column_major_group(rank: int, shape: Shape, name: str) -> list[int]:
    """The group of a mesh laid out the other way round: the FIRST dimension fastest."""
    flipped = dict(reversed(list(shape.items())))
    return reference_group(rank, flipped, name)


def same_coordinate(rank: int, shape: Shape, name: str) -> list[int]:
    """The ranks whose ``name`` coordinate equals ``rank``'s (color and key swapped)."""
    mine = reference_coords(rank, shape)[name]
    return [r for r in range(reference_mesh(shape).numel())
            if reference_coords(r, shape)[name] == mine]


# -- on each rank ------------------------------------------------------------------------------
def _local_problem(got, shape: Shape) -> str | None:
    """What is wrong with the returned value on this rank, before any group is used."""
    if not isinstance(got, dict):
        return (f"mesh_groups returned {type(got).__name__}, expected a dict of dimension name "
                f"-> Communicator with the keys {list(shape)}")
    missing = [name for name in shape if name not in got]
    if missing:
        return (f"the dict mesh_groups returned has no key {missing[0]!r} (its keys: "
                f"{list(got)}); expected one communicator per dimension: {list(shape)}")
    for name in shape:
        if not isinstance(got[name], Communicator):
            return (f"mesh_groups returned {type(got[name]).__name__} for {name!r}, expected "
                    "the Communicator that comm.split returns (a rank passing color=None "
                    "gets None: every rank belongs to one group of every dimension)")
    return None


def groups_case(comm, namespace, shape: Shape) -> dict:
    """The learner's groups on this rank: for each dimension, this rank's place in its group
    and the global ranks the group holds (from an all-reduce of one-hot vectors)."""
    got = namespace["mesh_groups"](comm, dict(shape))
    problem = _local_problem(got, shape)
    flags = comm.control.all_gather_ints([0 if problem is None else 1])
    if any(f[0] for f in flags):  # no rank communicates on a group another rank lacks
        return {"problem": problem}
    out = {}
    for name in shape:
        group = got[name]
        onehot = torch.zeros(comm.world_size, dtype=torch.float64)
        onehot[comm.rank] = 1.0
        all_reduce(group, onehot)
        out[name] = {"rank": group.rank, "size": group.world_size,
                     "members": onehot.nonzero().flatten().tolist()}
    return {"groups": out}


GRAD_SHAPES = (5, (2, 3))


def grads_of(rank: int, world: int) -> list[torch.Tensor]:
    """Rank ``rank``'s gradients: every value says which rank it came from (``pattern``)."""
    return [pattern(rank, n, torch.float64, world) for n in GRAD_SHAPES]


def record_calls(groups: dict) -> list[dict]:
    """From now on, every collective call of this rank: its name, the group it ran on (a
    name of ``groups``, else "another communicator") and its elements."""
    made = []

    def recorder(c) -> None:
        group = next((n for n, g in groups.items() if g is c.comm), "another communicator")
        made.append({"name": c.name, "group": group, "numel": c.numel})

    record_collectives(recorder)
    return made


def sync_case(comm, namespace, shape: Shape) -> dict:
    """The learner's ``sync_gradients`` on the grader's own groups; the gradients after it,
    and every collective it called."""
    groups = {}
    for name in shape:  # the grader's groups, built with split as the exercise describes
        members = reference_group(comm.rank, shape, name)
        groups[name] = comm.split(color=members[0], key=members.index(comm.rank))
    grads = grads_of(comm.rank, comm.world_size)
    originals = list(grads)  # the caller's tensors (a model's p.grad): judged, not the list
    made = record_calls(groups)
    returned = namespace["sync_gradients"](groups, grads)
    made = list(made)
    if isinstance(returned, (list, tuple)) and all(isinstance(t, torch.Tensor)
                                                   for t in returned):
        returned = [t.detach().clone() for t in returned]
    else:
        returned = None
    return {"grads": [g.detach().clone() for g in originals], "returned": returned,
            "replaced": [j for j, (a, b) in enumerate(zip(originals, grads)) if a is not b],
            "calls": made}


def expected_grads(rank: int, shape: dict) -> list[torch.Tensor]:
    """The oracle: rank ``rank``'s gradients averaged over its dp group."""
    world, dp = reference_mesh(shape).numel(), reference_group(rank, shape, "dp")
    return [sum(g[j] for g in (grads_of(r, world) for r in dp)) / len(dp)
            for j in range(len(grads_of(0, world)))]
