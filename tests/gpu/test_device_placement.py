"""Device placement without a GPU (issue 30): each tensor a strategy makes for a message, a
flag or a buffer is made on the device of the module or communicator it serves. NCCL (the
torch backend on CUDA) sends and reduces CUDA tensors only, so a CPU tensor there is a crash
this machine never sees. Two tricks make it visible on the CPU, as in
``tests/parallel/pipeline/test_p2p.py``: modules on torch's ``meta`` device (shapes, no
data), and a communicator that claims a GPU (``cuda:1``) while torch's factories record the
device each call asks for and build the tensor on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import minidist as md
from minidist.models.gpt import GPTConfig
from minidist.parallel import hybrid
from minidist.parallel.amp import inf_agreement, unscale_and_check
from minidist.parallel.data.scheduler import BucketScheduler
from minidist.parallel.elastic import commit_store, loop
from minidist.parallel.elastic import state as elastic_state
from minidist.parallel.elastic.full_state import export_state, import_state
from minidist.trace import Timeline

META, FAKE_GPU = torch.device("meta"), torch.device("cuda", 1)


class FakeComm:
    """What these code paths read of a communicator: rank, world_size, device, timeline."""

    def __init__(self, rank: int = 0, world_size: int = 2, device=FAKE_GPU):
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.timeline = Timeline(rank)


@pytest.fixture
def asked(monkeypatch) -> list:
    """The device each ``torch.tensor`` / ``zeros`` / ``arange`` call asks for (None: the
    default, the CPU); the tensor itself is built on the CPU."""
    calls = []
    for name in ("tensor", "zeros", "arange"):
        real = getattr(torch, name)

        def recording(*args, device=None, _real=real, **kw):
            calls.append(None if device is None else torch.device(device))
            return _real(*args, **kw)

        monkeypatch.setattr(torch, name, recording)
    return calls


def recorder(log: list, result=None):
    """A stand-in collective: records its tensor's device, changes nothing."""
    def collective(comm, t, *args, **kw):
        log.append(t.device)
        return t if result is None else result
    return collective


def test_found_inf_flag_is_on_the_communicators_device(asked, monkeypatch):
    seen = []
    monkeypatch.setattr(inf_agreement, "all_reduce", recorder(seen))
    assert inf_agreement.agree_found_inf([FakeComm()], True) is True
    assert asked == [FAKE_GPU]
    assert inf_agreement.agree_found_inf([], True) is True  # no group: nothing to agree


def test_ddp_unused_parameter_flags_are_on_the_communicators_device(asked, monkeypatch):
    seen = []
    monkeypatch.setattr("minidist.parallel.data.scheduler.all_reduce", recorder(seen))
    stub = SimpleNamespace(used=[True, False, True], comm=FakeComm())
    assert BucketScheduler._globally_unused(stub) == {1}
    assert asked == [FAKE_GPU]


def test_elastic_membership_and_restore_broadcast_on_the_communicators_device(asked,
                                                                             monkeypatch):
    seen = []
    monkeypatch.setattr(loop, "broadcast", recorder(seen))
    loop.check_membership(FakeComm(), SimpleNamespace(offered=lambda step: 2), step=3)
    monkeypatch.setattr(elastic_state, "broadcast", recorder(seen, torch.tensor([0])))
    store = SimpleNamespace(load=lambda warn: None, loaded_from=None, path="c", prev="p",
                            warn=False)
    stub = SimpleNamespace(store=store)
    assert elastic_state.TorchState.restore(stub, FakeComm()) is False  # no commit yet
    # membership's count, the stand-in's reply (the default: this test's own), restore's
    assert asked == [FAKE_GPU, None, FAKE_GPU]


def test_column_parallel_rows_live_with_the_weight(asked):
    """The rows buffer is all-gathered by full_weight: it must be on the weight's device,
    both when from_full makes it and when it is given (parallel_gpt's attention rows)."""
    made = md.ColumnParallelLinear.from_full(nn.Linear(4, 6, device=META), FakeComm(1, 2))
    assert asked == [META]
    assert made.rows.device == META and made.weight.device == META
    given = md.ColumnParallelLinear.from_full(nn.Linear(4, 6, device=META), FakeComm(0, 2),
                                              rows=torch.tensor([0, 2, 4]))
    assert given.rows.device == META


class Mesh:
    """A one-rank dp x pp x tp mesh whose communicator claims ``device``."""

    def __init__(self, device):
        self.comm, self.coords = FakeComm(device=device), {"dp": 0, "pp": 0, "tp": 0}
        self.group = SimpleNamespace(world_size=1, rank=0)

    def size(self, name: str) -> int:
        return 1

    def __getitem__(self, name: str):
        return self.group


def test_hybrid_builds_on_the_mesh_device_and_reduces_there(monkeypatch):
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8,
                    tie_weights=False)
    mesh = Mesh(META)
    layers, _, shapes = hybrid.build_stage(cfg, mesh, torch.float32, "auto")
    assert {p.device for p in layers.parameters()} == {META}
    seen = []
    monkeypatch.setattr(hybrid, "broadcast", recorder(seen))
    monkeypatch.setattr(hybrid, "all_reduce", recorder(seen, torch.zeros(1)))
    params = list(layers.parameters())
    stub = SimpleNamespace(stage=SimpleNamespace(is_last=True), microbatches=1,
                           params=params, mesh=mesh, shapes=shapes,
                           _gathered_over_tp=lambda: {})
    hybrid.HybridGPT._mean_loss(stub, [torch.tensor(1.0)], torch.zeros(2, 8))
    assert seen == [META, META]  # the loss broadcast over pp, averaged over dp
    seen.clear()
    hybrid.HybridGPT.full_parameters(stub)  # a stage holding none: zeros, summed over pp
    assert seen == [META] * len(shapes)
    stub.params = [nn.Parameter(torch.zeros(3))]  # the batch follows the parameters
    stub.mesh.coords = {"dp": 0}
    assert hybrid.HybridGPT._my_slice(stub, torch.zeros(4, 2), "x").device.type == "cpu"


def test_restored_optimizer_state_follows_the_parameters(tmp_path, monkeypatch):
    """A commit is read onto the CPU (written on a GPU, it restores anywhere), and each
    per-element optimizer state lands on its parameter's device; ``step`` stays on the
    CPU, as torch's Optimizer.load_state_dict keeps it."""
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = export_state(model, opt, FakeComm(device="cpu"))
    meta_model = nn.Linear(3, 2, device=META)
    meta_opt = torch.optim.Adam(meta_model.parameters(), lr=0.1)
    import_state(meta_model, meta_opt, state)
    for p in meta_model.parameters():
        assert meta_opt.state[p]["exp_avg"].device == META
        assert meta_opt.state[p]["exp_avg_sq"].device == META
        assert meta_opt.state[p]["step"].device.type == "cpu"
    store = commit_store.CommitStore(tmp_path, warn=False)
    ts = elastic_state.TorchState(store, model, opt)
    ts.commit(FakeComm(device="cpu"))
    kwargs, real = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: kwargs.append(kw) or real(*a, **kw))
    store.read(store.path)
    assert kwargs and kwargs[-1].get("map_location") == "cpu"


class Recorded(TorchFunctionMode):
    """The host reads (a GPU waits for each) and the index of each ``index_add_`` call."""

    def __init__(self):
        super().__init__()
        self.reads, self.index_adds = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("item", "tolist", "__bool__", "__int__", "__float__"):
            self.reads.append(name)
        if name == "index_add_":
            self.index_adds.append(args[2].clone())
        return func(*args, **(kwargs or {}))


def test_the_scaler_reads_its_found_inf_check_once_per_device():
    grads = [torch.ones(3) for _ in range(5)] + [torch.tensor([1.0, float("inf")])]
    with Recorded() as mode:
        found = unscale_and_check(grads, 0.5)
    assert found and mode.reads == ["__bool__"]  # not one read per gradient
    assert torch.equal(grads[0], torch.full((3,), 0.5))
    with Recorded() as mode:
        assert not unscale_and_check([torch.ones(2), torch.zeros(4)], 2.0)
    assert mode.reads == ["__bool__"]


def test_topk_adds_the_ranks_picks_without_colliding_indices(monkeypatch):
    """Two ranks that pick the same entries: no index_add_ call may hold an index twice
    (a GPU adds colliding indices with atomics, in no fixed order: replicas would part)."""
    monkeypatch.setattr("minidist.compression.topk.all_gather",
                        lambda comm, t: torch.stack([t, t]))  # rank 1 sent what rank 0 did
    bucket = SimpleNamespace(buffer=torch.tensor([4.0, -1.0, 3.0, 0.5]), index=0)
    with Recorded() as mode:
        out = md.compression.TopK(0.5)(FakeComm(device="cpu"), bucket)
    assert torch.equal(out, torch.tensor([4.0, 0.0, 3.0, 0.0]))  # (x + x) / 2 on the picks
    assert mode.index_adds and all(i.unique().numel() == i.numel() for i in mode.index_adds)
