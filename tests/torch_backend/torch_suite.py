"""torch's own distributed test suite, with minidist as the backend under test.

    python tests/torch_backend/torch_suite.py            # the chosen tests (CHOSEN)
    python tests/torch_backend/torch_suite.py NAME ...   # some of torch's tests by name

``torch/testing/_internal/distributed/distributed_test.py`` ships in torch's wheel: its
``DistributedTest._DistTestBase`` is run by torch's CI against gloo and NCCL (torch's
``test/distributed/test_distributed_spawn.py``); here the same class runs against
``BACKEND=minidist``. Each test forks ``WORLD_SIZE`` ranks, each calls
``dist.init_process_group("minidist", init_method="file://...")`` (torch's FileStore
rendezvous; the backend then builds its shared-memory world), runs the test and compares
with what torch's authors expect. Needs ``expecttest`` (the dev extra). Which tests run,
and why the others do not, is in the README ("minidist as a torch.distributed backend").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest
from collections import Counter

os.environ.setdefault("BACKEND", "minidist")  # read when distributed_test is imported
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("MINIDIST_TIMEOUT", "60")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# torch's suite gates tests on tables of what each backend implements, read when
# distributed_test is imported; "plugin" is its slot for an out-of-tree backend. minidist
# implements DDP and subgroups; the "gpu" table also gates CPU DDP tests (those that need
# a GPU skip on skip_if_lt_x_gpu regardless).
for _feature in ("plugin", "ddp", "subgroup", "gpu"):
    DistTestCases.backend_feature[_feature].add("minidist")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

import minidist  # noqa: E402,F401 (registers the backend in this process and its forks)
from minidist.torch_backend.process_group import ProcessGroupMinidist  # noqa: E402

CHOSEN = [
    # point to point
    "test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend",
    "test_irecv",
    # rooted collectives
    "test_broadcast", "test_broadcast_full_group", "test_reduce_sum", "test_reduce_product",
    "test_reduce_min", "test_reduce_max", "test_reduce_full_group_sum",
    "test_reduce_full_group_product", "test_reduce_full_group_min",
    "test_reduce_full_group_max", "test_reduce_sum_twice", "test_scatter",
    "test_scatter_complex", "test_scatter_checks", "test_gather", "test_gather_checks",
    "test_gather_full_group",
    # all-reduce
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_product", "test_all_reduce_min", "test_all_reduce_max",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_product",
    "test_all_reduce_full_group_min", "test_all_reduce_full_group_max",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_coalesced_max_complex_unsupported",
    # all-gather and its coalesced form, barrier
    "test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_with_empty", "test_all_gather_coalesced_full_group",
    "test_barrier", "test_barrier_full_group",
    # objects, groups, the API around them
    "test_all_gather_object_default_pg", "test_get_rank", "test_get_backend",
    "test_Backend_enum_class", "test_get_rank_size_group", "test_get_rank_size_full_group",
    "test_destroy_group", "test_destroy_full_group",
    # DDP on CPU
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_ddp_create_graph", "test_static_graph_api_cpu", "test_ddp_logging_data_cpu",
    "test_dump_DDP_relevant_env_vars",
]


class TestMinidistBackend(TestDistBackend, DistributedTest._DistTestBase):
    """torch's tests, each on freshly forked ranks (fork: torch is imported once). Each
    rank checks that its default group is minidist's and records what torch called."""

    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def run_test(self, test_name, parent_pipe):
        pg = dist.group.WORLD
        if not isinstance(pg, ProcessGroupMinidist):
            raise AssertionError(f"{test_name}: the default group is {pg!r}, not minidist's")
        try:
            super().run_test(test_name, parent_pipe)
        finally:
            _record_calls(test_name, self.rank, pg.call_counts)


def _record_calls(test_name: str, rank: int, counts) -> None:
    folder = os.environ.get("MINIDIST_SUITE_CALLS")
    if folder:
        with open(os.path.join(folder, f"{test_name}.{rank}.json"), "w") as f:
            json.dump(dict(counts), f)


def _total_calls(folder: str) -> Counter:
    total: Counter = Counter()
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            total.update(json.load(f))
    return total


def suite(names: list[str]) -> unittest.TestSuite:
    unknown = [n for n in names if not hasattr(TestMinidistBackend, n)]
    if unknown:
        raise SystemExit(f"not tests of torch's distributed_test.py: {', '.join(unknown)}")
    return unittest.TestSuite(TestMinidistBackend(name) for name in names)


def main(argv: list[str]) -> int:
    names = argv or CHOSEN
    with tempfile.TemporaryDirectory() as folder:
        os.environ["MINIDIST_SUITE_CALLS"] = folder
        result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite(names))
        calls = _total_calls(folder)
    ran = result.testsRun - len(result.skipped)
    print("backend calls, all ranks:", ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    print(f"minidist torch suite: {len(names)} chosen, {ran} ran, {len(result.skipped)} skipped, "
          f"{len(result.failures)} failed, {len(result.errors)} errors")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
