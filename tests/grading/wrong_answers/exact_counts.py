"""Answers that are right in value but move the wrong number of bytes (issue 27): the data
passed through files in the temp directory while the ranks send nothing (exercises 01, 09,
10), and the leader-only hierarchical all_reduce (local rank 0 carries the whole tensor
across nodes, the design lesson 09 argues against). Every count a test checks is exact, so
each loses the points, with a hint that says where the bytes went missing."""

from . import Wrong
from .exercise_09 import RIGHT_HIER

# A file exchange: each rank writes its tensor, a barrier, each rank reads every rank's.
# The barrier's messages travel on the library's control channel, which no test counts.
FILES = '''\
import os as _os
import tempfile as _tempfile

import numpy as _np


def _through_files(comm, x):
    _through_files.k = getattr(_through_files, "k", 0) + 1
    base = _os.path.join(_tempfile.gettempdir(),
                         f"g27_{_os.getppid()}_{_through_files.k}_")
    a = x.detach().contiguous().numpy()
    a.tofile(base + str(comm.rank))
    comm.barrier()
    out = [torch.from_numpy(_np.fromfile(base + str(r), dtype=a.dtype)).reshape(x.shape)
           for r in range(comm.world_size)]
    comm.barrier()
    _os.remove(base + str(comm.rank))
    return out


'''
FILE_SUM = "    t.copy_(sum(_through_files(comm, t)).to(t.dtype))\n    return t\n"

EX01, EX09, EX10 = "01_collectives", "09_communication_efficiency", "10_bug_zoo"
HIER, TOPK, POWER = "test_hierarchical_all_reduce", "test_topk_step", "test_powersgd_step"
ELSEWHERE = "got its data some other way (a file, shared memory)"

WRONG = [
    Wrong("files_ring_all_reduce", EX01, {"ring_all_reduce": (
        FILES + "def ring_all_reduce(comm, t):\n" + FILE_SUM)},
        {"test_ring_all_reduce": ELSEWHERE}),
    Wrong("files_ring_reduce_scatter", EX01, {"ring_reduce_scatter": FILES + '''\
def ring_reduce_scatter(comm, chunks):
    total = sum(_through_files(comm, torch.cat(chunks)))
    chunks[comm.rank].copy_(total.tensor_split(comm.world_size)[comm.rank])
'''}, {"test_ring_reduce_scatter": ELSEWHERE, "test_ring_all_reduce": ELSEWHERE}),
    Wrong("files_hierarchical_all_reduce", EX09, {"hierarchical_all_reduce": (
        FILES + "def hierarchical_all_reduce(comm, t, per_node):\n" + FILE_SUM)},
        {HIER: "nothing crossed nodes, yet the sums arrived: the data must travel in comm's "
               "messages (not a file, not shared memory)"}),
    Wrong("hier_leader_only", EX09, {"hierarchical_all_reduce": '''\
def hierarchical_all_reduce(comm, t, per_node):
    node = comm.split(color=comm.rank // per_node, key=comm.rank)
    leaders = comm.split(color=0 if comm.rank % per_node == 0 else 1, key=comm.rank)
    md.reduce(node, t, dst=0)  # the node's sum on its local rank 0
    if comm.rank % per_node == 0:
        md.all_reduce(leaders, t, algorithm="ring")  # the leaders carry it all across
    md.broadcast(node, t, src=0)
    return t
'''}, {HIER: "sent nothing across: every rank carries its own shard across nodes, each on "
             "its own network card (a leader that carries the whole tensor leaves the others "
             "idle"}),
    Wrong("hier_across_tree", EX09, {"hierarchical_all_reduce": (
        "def hierarchical_all_reduce(comm, t, per_node):\n" + RIGHT_HIER.replace(
            'algorithm="ring"', 'algorithm="tree"'))},
        {HIER: "with 3 nodes of 2 ranks (world_size=6), a float64 tensor of 12 elements: "
               "the ranks sent"}),
    Wrong("files_topk_step", EX09, {"topk_step": FILES + '''\
def topk_step(comm, grad, residual, k):
    corrected = grad + residual
    idx = torch.topk(corrected.abs(), k).indices
    sparse = torch.zeros_like(corrected)
    sparse[idx] = corrected[idx]
    new_residual = corrected - sparse
    return sum(_through_files(comm, sparse)) / comm.world_size, new_residual
'''}, {TOPK: "nothing travelled, yet the averages arrived: the data must travel in comm's "
             "messages"}),
    Wrong("files_powersgd_step", EX09, {"powersgd_step": FILES + '''\
def powersgd_step(comm, M, Q):
    P = sum(_through_files(comm, M @ Q)) / comm.world_size
    P = torch.linalg.qr(P).Q
    Q = sum(_through_files(comm, M.T @ P)) / comm.world_size
    return P @ Q.T, Q
'''}, {POWER: "fewer bytes than two ring all_reduces of P and Q"}),
    Wrong("files_zoo10_ring", EX10, {"ring_all_reduce": (
        FILES + "def ring_all_reduce(comm, t):\n" + FILE_SUM)},
        {"test_ring_all_reduce": "a rank that sends less got its data some other way"}),
]
