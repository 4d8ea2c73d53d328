"""The backend's own promises: calls return before they finish, results are minidist's
bits, bad input is refused by name on every rank, untested torch versions are refused,
and ``dist.init_process_group("minidist")`` works after ``import minidist`` (torch's
rendezvous through a FileStore here, through ``minidist run``'s store below).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import minidist as md
from minidist.torch_backend import torch_private


def _returns_before_done(comm):
    """Rank 1 enters the all_reduce only after a message rank 0 sends once its own
    all_reduce has been issued: a blocking all_reduce would deadlock here."""
    md.torch_backend.init_process_group(comm)
    t = torch.arange(6, dtype=torch.float64) * (comm.rank + 1)
    mine = t.clone()
    if comm.rank == 0:
        work = dist.all_reduce(t, async_op=True)
        dist.send(torch.ones(1), dst=1)
        work.wait()
    else:
        dist.recv(torch.empty(1), src=0)
        dist.all_reduce(t)
    dist.destroy_process_group()
    md.all_reduce(comm, mine)  # the same reduction straight through minidist
    return torch.equal(t, mine)


def test_collectives_return_before_they_finish_with_minidists_bits():
    assert md.launch(_returns_before_done, 2, timeout=30) == [True, True]


def _refusals(comm):
    md.torch_backend.init_process_group(comm)
    said = {}
    attempts = {
        "op": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.BAND),
        "reduce_dtype": lambda: dist.all_reduce(torch.ones(2, dtype=torch.uint8)),
        "carried_dtype": lambda: dist.broadcast(torch.ones(2, dtype=torch.uint16), src=0),
        "device": lambda: dist.all_reduce(torch.ones(2, device="meta")),
        "sizes": lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)),
        "local_sync": lambda: dist.new_group([0, 1], use_local_synchronization=True),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            said[name] = None
        except Exception as e:  # noqa: BLE001 (the message is the result)
            said[name] = f"{type(e).__name__}: {e}"
    t = torch.ones(2)
    dist.all_reduce(t)  # the group still works after refusing all of the above
    said["still_works"] = t.tolist()
    dist.destroy_process_group()
    return said


def test_bad_input_is_refused_by_name_on_every_rank():
    for said in md.launch(_refusals, 2, timeout=30):
        assert "all_reduce" in said["op"] and "BAND" in said["op"]
        assert "all_reduce" in said["reduce_dtype"] and "uint8" in said["reduce_dtype"]
        assert "broadcast" in said["carried_dtype"] and "uint16" in said["carried_dtype"]
        assert "all_reduce" in said["device"] and "meta" in said["device"]
        assert "all_gather_into_tensor" in said["sizes"]
        assert "use_local_synchronization" in said["local_sync"]
        assert said["still_works"] == [2.0, 2.0]


def _init_refusals(comm):
    said = []
    for attempt in (lambda: md.torch_backend.init_process_group("comm"),
                    lambda: md.torch_backend.init_process_group(comm.split(0)),
                    lambda: md.torch_backend.init_process_group(comm, all_reduce=3)):
        try:
            attempt()
            said.append(None)
        except (TypeError, ValueError) as e:
            said.append(str(e))
    md.torch_backend.init_process_group(comm)
    try:
        md.torch_backend.init_process_group(comm)
    except RuntimeError as e:
        said.append(str(e))
    dist.destroy_process_group()
    return said


def test_init_process_group_refuses_what_it_cannot_use():
    for said in md.launch(_init_refusals, 2, timeout=30):
        assert "md.Communicator" in said[0]
        assert "split" in said[1]
        assert "all_reduce must be a function" in said[2]
        assert "already initialised" in said[3]


def test_untested_torch_is_refused_by_name(monkeypatch):
    monkeypatch.delenv("MINIDIST_TORCH_UNTESTED", raising=False)
    with pytest.raises(RuntimeError, match=r"tested on torch 2\.13.*this is torch 2\.11\.0"):
        torch_private.check_torch_version("2.11.0")
    torch_private.check_torch_version("2.13.1+cpu")
    monkeypatch.setenv("MINIDIST_TORCH_UNTESTED", "1")
    torch_private.check_torch_version("2.11.0")


def _by_torch_rendezvous(comm, path):
    """No communicator handed over: torch's own rendezvous (a FileStore), then the
    backend builds its shared-memory world from it."""
    dist.init_process_group("minidist", init_method=f"file://{path}", rank=comm.rank,
                            world_size=comm.world_size)
    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    name = dist.get_backend()
    dist.destroy_process_group()
    return name, t.tolist()


def test_init_process_group_minidist_after_import(tmp_path):
    assert "minidist" in dist.Backend.backend_list
    out = md.launch(_by_torch_rendezvous, 3, args=(str(tmp_path / "store"),), timeout=60)
    assert out == [("minidist", [6.0] * 3)] * 3


def test_several_machines_are_refused(monkeypatch):
    from minidist.torch_backend.torchrun_world import join_local_world

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="all run on one machine"):
        join_local_world(None, 0, 4, None)


SCRIPT = """
import os, torch, torch.distributed as dist
import minidist  # registers "minidist"
dist.init_process_group("minidist")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# one write per line: two ranks' prints, word by word, interleave on the shared pipe
os.write(1, f"rank {dist.get_rank()} {dist.get_backend()} {t.item()}\\n".encode())
dist.destroy_process_group()
"""


@pytest.mark.parametrize("backend", ["local", "torch"])
def test_plain_torch_script_under_minidist_run(tmp_path, backend):
    script = tmp_path / "plain.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "2", "--backend",
                           backend, str(script)], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["rank 0 minidist 3.0", "rank 1 minidist 3.0"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_are_staged():
    def work(comm):
        md.torch_backend.init_process_group(comm)
        t = torch.full((4,), float(comm.rank + 1), device="cuda")
        dist.all_reduce(t)
        dist.destroy_process_group()
        return t.cpu().tolist()

    assert md.launch(work, 2, device="cuda", timeout=60) == [[3.0] * 4] * 2
