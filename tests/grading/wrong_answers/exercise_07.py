"""Wrong (and rightly different) answers to exercise 07: coordinates laid out with the first
dimension fastest or without the modulo, groups whose color and key are swapped, whose color
is the rank or the same everywhere, whose key reverses the order, blocks of adjacent ranks
for every dimension, None for some ranks; gradients averaged over tp, over every group, summed
or divided by the world size; and the library's mesh and torch's init_device_mesh."""

from . import Wrong

EX = "07_hybrid_parallelism"
COORDS, GROUPS, SYNC = "test_mesh_coords", "test_mesh_groups", "test_sync_gradients"
STRIDES = """\
    coords, strides, step = mesh_coords(comm.rank, shape), {}, 1
    for name in reversed(list(shape)):
        strides[name], step = step, step * shape[name]
"""


def coords(body: str) -> dict:
    return {"mesh_coords": "def mesh_coords(rank, shape):\n" + body}


def groups(body: str) -> dict:
    return {"mesh_groups": "def mesh_groups(comm, shape):\n" + body}


def sync(body: str) -> dict:
    return {"sync_gradients": "def sync_gradients(groups, grads):\n" + body}


WRONG = [
    Wrong("coords_first_dimension_fastest", EX, coords("""\
    out, stride = {}, 1
    for name in shape:
        out[name] = rank // stride % shape[name]
        stride *= shape[name]
    return out
"""), {COORDS: "that is a mesh with the FIRST dimension fastest",
       GROUPS: "color must be a non-negative int"}),
    Wrong("coords_no_modulo", EX, coords("""\
    out, stride = {}, 1
    for name in reversed(list(shape)):
        out[name] = rank // stride
        stride *= shape[name]
    return {name: out[name] for name in shape}
"""), {COORDS: "take it modulo the dimension's size, (rank // stride) % size",
       GROUPS: "the pp group of rank 0 holds ranks [0, 2, 4, 6] where it should hold [0, 2]"}),
    Wrong("coords_as_a_tuple", EX, coords("""\
    return tuple(int(c) for c in (torch.arange(
        torch.tensor(list(shape.values())).prod()).reshape(*shape.values()) == rank)
        .nonzero()[0])
"""), {GROUPS: "TypeError"}),
    Wrong("coords_library", EX, coords("""\
    from minidist.parallel.mesh import coords_of
    return coords_of(rank, shape)
"""), {COORDS: "minidist.parallel.mesh.coords_of is not allowed in this exercise",
       GROUPS: "minidist.parallel.mesh.coords_of is not allowed in this exercise"}),
    Wrong("coords_stride_counts_its_own_size", EX, coords("""\
    out, stride = {}, 1
    for name in reversed(list(shape)):
        stride *= shape[name]
        out[name] = rank // stride % shape[name]
    return {name: out[name] for name in shape}
"""), {COORDS: "the strides are one dimension off: stride_d is the product of the sizes "
               "AFTER d", GROUPS: "rank 0 is alone in its group"}),
    Wrong("coords_keys_in_reverse_order", EX, coords("""\
    out, stride = {}, 1
    for name in reversed(list(shape)):
        out[name] = rank // stride % shape[name]
        stride *= shape[name]
    return out
"""), {COORDS: "expected a dict of dimension name -> coordinate with the keys ['dp', 'pp', "
               "'tp'], in order"}),
    Wrong("coords_modulo_only", EX, coords("""\
    return {name: rank % size for name, size in shape.items()}
"""), {COORDS: "rank % size is the coordinate of the last dimension only",
       GROUPS: "ValueError: color must be a non-negative int or None, got"}),
    Wrong("coords_tensor_values", EX, coords("""\
    sizes = list(shape.values())
    mesh = torch.arange(torch.tensor(sizes).prod()).reshape(sizes)
    return dict(zip(shape, (mesh == rank).nonzero()[0]))
"""), {COORDS: "whose coordinates are Tensor; expected Python ints",
       GROUPS: "ValueError: color must be a non-negative int or None, got"}),
    Wrong("coords_true_division", EX, coords("""\
    out, stride = {}, 1
    for name in reversed(list(shape)):
        out[name] = rank / stride % shape[name]
        stride *= shape[name]
    return {name: out[name] for name in shape}
"""), {COORDS: "whose coordinates are float; expected Python ints: use integer division",
       GROUPS: "ValueError: color must be a non-negative int or None, got"}),
    Wrong("coords_dimensions_sorted_by_name", EX, coords("""\
    out, stride = {}, 1
    for name in sorted(shape, reverse=True):
        out[name] = rank // stride % shape[name]
        stride *= shape[name]
    return {name: out[name] for name in shape}
"""), {COORDS: "that is the layout of the dimensions sorted by name",
       GROUPS: "ValueError: color must be a non-negative int or None, got"}),
    Wrong("coords_fixed_dp_pp_tp", EX, coords("""\
    pp, tp = shape.get("pp", 1), shape.get("tp", 1)
    return {"dp": rank // (pp * tp), "pp": rank // tp % pp, "tp": rank % tp}
"""), {COORDS: "expected a dict of dimension name -> coordinate with the keys ['dp', 'tp'], "
               "in order", GROUPS: "ValueError: color must be a non-negative int or None, got"}),
    Wrong("groups_color_and_key_swapped", EX, groups(STRIDES + """\
    return {name: comm.split(color=coords[name], key=comm.rank - coords[name] * strides[name])
            for name in shape}
"""), {GROUPS: "those are the ranks whose dp coordinate equals rank 0's. Are the color and "
               "the key swapped?"}),
    Wrong("groups_color_is_the_rank", EX, groups(STRIDES + """\
    return {name: comm.split(color=comm.rank, key=coords[name]) for name in shape}
"""), {GROUPS: "rank 0 is alone in its group, so no other rank passed its color"}),
    Wrong("groups_one_color", EX, groups(STRIDES + """\
    return {name: comm.split(color=0, key=coords[name]) for name in shape}
"""), {GROUPS: "holds ranks [0, 1, 2, 3, 4, 5, 6, 7] where it should hold [0, 4]: every "
               "rank passed the same color"}),
    Wrong("groups_adjacent_blocks", EX, groups("""\
    return {name: comm.split(color=comm.rank // shape[name], key=comm.rank) for name in shape}
"""), {GROUPS: "the dp group of rank 0 holds ranks [0, 1] where it should hold [0, 4]: that "
               "is rank 0's tp group"}),
    Wrong("groups_key_reversed", EX, groups(STRIDES + """\
    return {name: comm.split(color=comm.rank - coords[name] * strides[name], key=-comm.rank)
            for name in shape}
"""), {GROUPS: "rank 0 is rank 1 in its dp group [0, 4], where it should be rank 0, its dp "
               "coordinate"}),
    Wrong("groups_key_is_the_rank", EX, groups(STRIDES + """\
    return {name: comm.split(color=comm.rank - coords[name] * strides[name], key=comm.rank)
            for name in shape}
"""), passes=True),
    Wrong("groups_only_the_first_rank_joins", EX, groups(STRIDES + """\
    return {name: comm.split(color=comm.rank if coords[name] == 0 else None, key=coords[name])
            for name in shape}
"""), {GROUPS: "on rank 1, mesh_groups returned NoneType for 'tp', expected the Communicator "
               "that comm.split returns"}),
    Wrong("groups_a_list", EX, groups(STRIDES + """\
    return [comm.split(color=comm.rank - coords[name] * strides[name], key=coords[name])
            for name in shape]
"""), {GROUPS: "mesh_groups returned list, expected a dict of dimension name -> Communicator"}),
    Wrong("groups_library_mesh", EX, groups("""\
    mesh = md.DeviceMesh(comm, shape)
    return {name: mesh[name] for name in shape}
"""), {GROUPS: "minidist.parallel.mesh.DeviceMesh is not allowed in this exercise"}),
    Wrong("groups_torch_init_device_mesh", EX, groups("""\
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", tuple(shape.values()), mesh_dim_names=tuple(shape))
    return {name: mesh.get_group(name) for name in shape}
"""), {GROUPS: "torch.distributed.device_mesh.init_device_mesh is not allowed in this "
               "exercise"}),
    Wrong("dpsync_over_tp", EX, sync("""\
    for grad in grads:
        md.all_reduce(groups["tp"], grad, op="avg")
"""), {SYNC: "it combines the gradients of ranks [0, 1] (rank 0's tp group), where it "
             "should average those of its dp group [0, 4]"}),
    Wrong("dpsync_over_every_group", EX, sync("""\
    for group in groups.values():
        for grad in grads:
            md.all_reduce(group, grad, op="avg")
"""), {SYNC: "every rank: all-reducing over each dimension in turn covers the whole mesh"}),
    Wrong("dpsync_sum", EX, sync("""\
    for grad in grads:
        md.all_reduce(groups["dp"], grad)
"""), {SYNC: "that is the sum over the dp group [0, 4], not its average"}),
    Wrong("dpsync_divided_by_world_size", EX, sync("""\
    world = 1
    for group in groups.values():
        world *= group.world_size
    for grad in grads:
        md.all_reduce(groups["dp"], grad)
        grad /= world
"""), {SYNC: "that is the sum over the dp group [0, 4], divided by 8"}),
    Wrong("dpsync_new_tensors", EX, sync("""\
    return [md.all_reduce(groups["dp"], grad.clone(), op="avg") for grad in grads]
"""), {SYNC: "the right averages, returned as new tensors"}),
    Wrong("dpsync_library", EX, sync("""\
    from minidist.parallel.hybrid import average_gradients
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads):
        param.grad = grad
    average_gradients(groups["dp"], params)
"""), {SYNC: "minidist.parallel.hybrid.average_gradients is not allowed in this exercise"}),
    Wrong("dpsync_coalesced", EX, sync("""\
    md.all_reduce_coalesced(groups["dp"], grads, op="avg")
"""), passes=True),
    Wrong("dpsync_flat_buffer_not_copied_back", EX, sync("""\
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    md.all_reduce(groups["dp"], flat, op="avg")
"""), {SYNC: "the gradient is unchanged: average it in place over the dp group"}),
    Wrong("dpsync_all_gather_mean", EX, sync("""\
    for grad in grads:
        grad.copy_(md.all_gather(groups["dp"], grad).mean(0))
"""), {SYNC: "the averages are right, but rank 0's sync_gradients called md.all_gather of 5 "
             "elements on the dp group"}),
    Wrong("dpsync_reduce_then_broadcast", EX, sync("""\
    for grad in grads:
        md.reduce(groups["dp"], grad, dst=0, op="avg")
        md.broadcast(groups["dp"], grad, src=0)
"""), {SYNC: "called md.reduce of 5 elements on the dp group, md.broadcast of 5 elements"}),
    Wrong("dpsync_once_per_dimension", EX, sync("""\
    for name in groups:
        for grad in grads:
            md.all_reduce(groups["dp"], grad, op="avg")
"""), {SYNC: "needs exactly one md.all_reduce per gradient, of its size, on groups['dp']"}),
    Wrong("dpsync_element_by_element", EX, sync("""\
    for grad in grads:
        for value in grad.view(-1):
            md.all_reduce(groups["dp"], value, op="avg")
"""), {SYNC: "called md.all_reduce of 1 elements on the dp group, md.all_reduce of 1"}),
    Wrong("dpsync_flat_buffer", EX, sync("""\
    flat = md.all_reduce(groups["dp"], torch.cat([g.reshape(-1) for g in grads]), op="avg")
    for grad, piece in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(piece.view_as(grad))
"""), passes=True),
]
