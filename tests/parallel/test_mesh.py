"""``md.DeviceMesh``: row-major coordinates (last dimension fastest) equal to numpy/torch's C
order, sub-communicators whose members are exactly the ranks sharing every other coordinate
and that really talk among themselves, the same groups as torch's ``init_device_mesh`` on
gloo for the same shapes, and clear errors for shapes that cannot describe the world."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist as md
from minidist.parallel.mesh import check_shape, coords_of, group_of, groups, rank_of

SHAPES = [{"dp": 2, "pp": 2, "tp": 2}, {"dp": 4, "tp": 2}, {"pp": 2, "dp": 1, "tp": 4},
          {"x": 8}]


def _c_order_group(shape: dict, rank: int, name: str) -> list[int]:
    """The oracle: the ranks laid out by ``torch.arange(n).reshape(shape)`` (C order), and
    the line through ``rank`` along dimension ``name``."""
    grid = torch.arange(math.prod(shape.values())).reshape(tuple(shape.values()))
    where = [int(i) for i in (grid == rank).nonzero()[0]]
    axis = list(shape).index(name)
    where[axis] = slice(None)
    return grid[tuple(where)].tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_coordinates_and_groups_are_c_order(sizes, data):
    shape = {f"d{i}": s for i, s in enumerate(sizes)}
    n = math.prod(sizes)
    rank = data.draw(st.integers(0, n - 1))
    coords = coords_of(rank, shape)
    assert rank_of(coords, shape) == rank
    assert list(coords.values()) == [int(i) for i in
                                     (torch.arange(n).reshape(sizes) == rank).nonzero()[0]]
    for name in shape:
        assert group_of(rank, shape, name) == _c_order_group(shape, rank, name)
        parts = groups(shape, name)  # a partition of the ranks into groups of size_d
        assert sorted(r for g in parts for r in g) == list(range(n))
        assert all(len(g) == shape[name] for g in parts)


def test_tp_neighbours_are_adjacent_ranks():
    """The PTD-P layout on 8 ranks: tp pairs adjacent, pp pairs 2 apart, dp pairs 4 apart."""
    shape = {"dp": 2, "pp": 2, "tp": 2}
    assert groups(shape, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(shape, "pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(shape, "dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert coords_of(5, shape) == {"dp": 1, "pp": 0, "tp": 1}


def _mesh_rank(comm):
    """Each shape of SHAPES on 8 ranks: membership, local ranks and a message round."""
    out = []
    for shape in SHAPES:
        mesh = md.DeviceMesh(comm, shape)
        assert mesh.size() == comm.world_size and mesh.shape == shape
        for name in shape:
            sub = mesh[name]
            assert (sub.world_size, sub.rank) == (shape[name], mesh.coords[name])
            who = md.all_gather(sub, torch.tensor([comm.rank]))  # they really talk
            assert who.reshape(-1).tolist() == mesh.ranks(name)
        out.append({name: mesh.ranks(name) for name in shape} | {"coords": mesh.coords})
    return out


def _torch_rank(comm):
    """The same shapes under torch's ``init_device_mesh`` on gloo."""
    from torch.distributed.device_mesh import init_device_mesh
    out = []
    for shape in SHAPES:
        dm = init_device_mesh("cpu", tuple(shape.values()), mesh_dim_names=tuple(shape))
        groups_ = {name: dm[name].mesh.reshape(-1).tolist() for name in shape}
        assert all(dm[name].get_local_rank() == c
                   for name, c in zip(shape, dm.get_coordinate()))
        out.append(groups_ | {"coords": dict(zip(shape, dm.get_coordinate()))})
    return out


def test_groups_match_torch_init_device_mesh():
    """One torch-backend launch of 8 ranks builds both meshes for every shape; the groups of
    every dimension and the coordinates agree rank by rank."""
    ours = md.launch(_mesh_rank, 8, backend="torch", timeout=60)
    theirs = md.launch(_torch_rank, 8, backend="torch", timeout=60)
    assert ours == theirs


def test_meshes_on_the_local_backend():
    """The local transport (the default) gives the same groups."""
    ours = md.launch(_mesh_rank, 8, timeout=60)
    for rank, per_shape in enumerate(ours):
        for shape, got in zip(SHAPES, per_shape):
            assert got["coords"] == coords_of(rank, shape)
            for name in shape:
                assert got[name] == _c_order_group(shape, rank, name)


class _World:
    """Just what the checks before any communication read."""
    rank, world_size = 0, 8


@pytest.mark.parametrize("shape, error, words", [
    ({"dp": 2, "tp": 2}, ValueError, "holds 2 (dp) x 2 (tp) = 4 ranks but the communicator "
                                     "has world_size=8"),
    ({"dp": 16}, ValueError, "= 16 ranks"),
    ({"dp": 0, "tp": 8}, ValueError, "'dp' must be a positive integer, got 0"),
    ({"dp": -2, "tp": -4}, ValueError, "'dp' must be a positive integer, got -2"),
    ({"dp": 2.0, "tp": 4}, ValueError, "got 2.0"),
    ({"dp": True, "tp": 8}, ValueError, "got True"),
    ({}, TypeError, "non-empty dict"),
    ([2, 4], TypeError, "non-empty dict"),
    ({"": 8}, TypeError, "non-empty strings"),
])
def test_bad_shapes_name_the_mistake(shape, error, words):
    with pytest.raises(error) as info:
        md.DeviceMesh(_World(), shape)
    assert words in str(info.value)


def _unknown_dim_rank(comm):
    mesh = md.DeviceMesh(comm, {"dp": 1, "tp": 2})
    with pytest.raises(KeyError, match=r"no dimension 'pp'; its dimensions are \['dp', 'tp'\]"):
        mesh["pp"]
    with pytest.raises(KeyError, match="no dimension 'cp'"):
        mesh.ranks("cp")
    assert "pp" not in mesh and "tp" in mesh
    return repr(mesh)


def test_unknown_dimension_is_a_key_error():
    assert md.launch(_unknown_dim_rank, 2, timeout=30)[1] == \
        "DeviceMesh(dp=1, tp=2; rank 1 at {'dp': 0, 'tp': 1})"


def test_check_shape_returns_a_plain_dict():
    assert check_shape({"dp": 2, "tp": 4}, 8) == {"dp": 2, "tp": 4}
    with pytest.raises(ValueError, match="rank 8 is outside a mesh of 8 ranks"):
        coords_of(8, {"dp": 2, "tp": 4})
    with pytest.raises(ValueError, match="coordinate tp=4 is not in range"):
        rank_of({"dp": 0, "tp": 4}, {"dp": 2, "tp": 4})
