"""The commit files: loaded with ``weights_only=True`` (a planted file is refused and its code
never runs), only plain state committed, a damaged ``commit.pt`` named (or the previous
commit restored, with a warning naming both), the temporaries of a write cut short removed
before the next launch, and the commit directory checked before any rank starts."""

from __future__ import annotations

import os
import re
import signal
import stat
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minidist as md
from minidist.parallel.elastic import CommitError, CommitStore, ElasticSampler, TorchState

N, B = 12, 4  # 3 steps per epoch
G = torch.Generator().manual_seed(2)
X = torch.randn(N, 3, generator=G, dtype=torch.float64)
Y = torch.randn(N, 1, generator=G, dtype=torch.float64)


def _tiny(comm, rdzv, epochs: int = 1, die_committing: int | None = None):
    """A commit every step; ``die_committing``: rank 0 of the first attempt is killed while
    it writes the commit of that step. Returns the step and the commit directory's files
    as this attempt found them."""
    found = sorted(os.listdir(rdzv.store.path.parent))
    torch.manual_seed(0)
    ddp = md.DistributedDataParallel(nn.Linear(3, 1).double(), comm)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(rdzv.store, ddp, opt, sampler=ElasticSampler(N, B))

    def step(batch):
        if (rdzv.attempt, comm.rank, state.step + 1) == (0, 0, die_committing):
            torch.save = _die_while_saving  # this process only: it dies in the commit
        opt.zero_grad()
        losses = F.mse_loss(ddp(X[batch.ids]), Y[batch.ids], reduction="none").mean(1)
        batch.mean(losses).backward()
        opt.step()

    md.elastic.run(step, comm, state, rdzv, epochs=epochs, commit_every=1)
    return state.step, found


def _die_while_saving(obj, f):
    f.write(b"PK\x03\x04 half a commit")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _elastic(directory, world_size: int = 1, **kw):
    return md.elastic.launch(_tiny, world_size, commit_dir=directory, timeout=20, **kw)


class _Planted:
    """Unpickling it (``weights_only=False``) runs code: it creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_a_planted_commit_is_refused_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"step": 0, "model": _Planted(marker)}, tmp_path / "commit.pt")
    refused = r"commit\.pt refused: it holds objects a commit never contains \(builtins\.exec\)"
    with pytest.raises(CommitError, match=refused + ".*nothing in it ran") as info:
        _elastic(tmp_path)
    assert info.value.path == tmp_path / "commit.pt"
    with pytest.raises(CommitError, match=refused):
        CommitStore(tmp_path).load()
    assert not marker.exists(), "loading the commit ran the planted code"


@pytest.mark.parametrize("make", [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                  lambda p: torch.optim.Adam(p, lr=0.01),
                                  lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True)],
                         ids=["sgd-momentum", "adam", "adamw-amsgrad"])
def test_optimizer_state_commits_and_loads_under_weights_only(tmp_path, make):
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    opt = make(model.parameters())
    F.mse_loss(model(X), Y.expand(-1, 2)).backward()
    opt.step()
    store = CommitStore(tmp_path)
    store.save({"step": 1, "world_size": 1, "model": md.elastic.export_state(model, opt, None),
                "sampler": {"epoch": 0, "position": 4}, "fields": {"seen": [(0, 1)]}})
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    saved = torch.load(store.path, weights_only=True)["model"]
    fresh = nn.Linear(3, 2).double()
    fresh_opt = make(fresh.parameters())
    md.elastic.import_state(fresh, fresh_opt, saved)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(p, q) and opt.state[p].keys() == fresh_opt.state[q].keys()
        assert all(torch.equal(opt.state[p][k], fresh_opt.state[q][k]) for k in opt.state[p])


def test_a_field_weights_only_would_refuse_is_an_error_naming_it(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    store = CommitStore(tmp_path)
    with pytest.raises(TypeError, match=r"the field 'ratio' is a fractions\.Fraction: a commit "
                                        r"holds only tensors and plain types"):
        TorchState(store, model, opt, ratio=Fraction(1, 3))
    with pytest.raises(TypeError, match=r"the commit\['fields'\]\['seen'\]\[1\] is a "
                                        r"fractions\.Fraction.*weights_only=True"):
        store.save({"step": 1, "world_size": 1, "model": md.elastic.export_state(model, opt, None),
                    "sampler": None, "fields": {"seen": [1, Fraction(1, 3)]}})
    assert os.listdir(tmp_path) == [], "a refused commit left a file"


def test_a_rank_killed_while_committing_leaves_no_temporary_for_the_next_launch(tmp_path):
    for name in ("keep.tmp", ".commit-notes.txt"):  # not the commits' temporaries: kept
        (tmp_path / name).write_text("mine")
    out = _elastic(tmp_path, 2, kwargs={"die_committing": 2})
    first, second = out.attempts[:2]
    assert first.failed_rank == 0 and "SIGKILL" in first.error and second.start_step == 1
    assert out[0][0] == 3
    assert set(out[0][1]) == {".commit-notes.txt", "commit.pt", "commit.prev.pt", "keep.tmp"}


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2] if how == "truncated" else os.urandom(len(data)))


@pytest.mark.parametrize("how", ["truncated", "random bytes"])
def test_a_damaged_commit_without_a_previous_one_says_how_to_start_over(tmp_path, how):
    _elastic(tmp_path)
    (tmp_path / "commit.prev.pt").unlink()
    _damage(tmp_path / "commit.pt", how)
    damaged = re.escape(f"{tmp_path}/commit.pt is damaged")
    with pytest.raises(CommitError, match=damaged + r".* There is no previous commit .* To "
                                          r"start over, delete .*fresh directory"):
        _elastic(tmp_path)


@pytest.mark.parametrize("how", ["truncated", "random bytes"])
def test_a_damaged_commit_falls_back_to_the_previous_one_with_a_warning(tmp_path, how):
    assert _elastic(tmp_path)[0][0] == 3  # commit.pt: step 3, commit.prev.pt: step 2
    for name in ("commit.pt", "commit.prev.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    _damage(tmp_path / "commit.pt", how)
    with pytest.warns(UserWarning) as caught:
        out = _elastic(tmp_path, 2, kwargs={"epochs": 2})  # rank 1 reads what rank 0 chose
    said = [str(w.message) for w in caught if "Restored the previous commit" in str(w.message)]
    assert len(said) == 1, said
    assert f"{tmp_path}/commit.pt is damaged" in said[0]
    assert f"{tmp_path}/commit.prev.pt (step 2)" in said[0]
    assert out.attempts[0].start_step == 2 and out[0][0] == 6
    store = CommitStore(tmp_path)
    _damage(store.path, how)
    with pytest.warns(UserWarning, match="Restored the previous commit"):
        assert store.load()["step"] == 5 and store.loaded_from == store.prev
    store.save(store.read(store.prev))  # replaces the damaged file, keeps the good previous
    assert store.read(store.prev)["step"] == 5 and store.read(store.path)["step"] == 5
    _damage(store.path, how)
    _damage(store.prev, how)
    with pytest.raises(CommitError, match=r"commit\.pt is damaged.* The previous commit is no "
                                          r"better: .*commit\.prev\.pt is damaged"):
        store.load()


def test_a_missing_commit_dir_is_created_for_the_owner_only(tmp_path):
    directory = tmp_path / "runs" / "first"
    assert _elastic(str(directory))[0][0] == 3
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert CommitStore(directory).step() == 3


def test_a_commit_dir_that_cannot_hold_commits_is_an_error_before_any_launch(tmp_path):
    (tmp_path / "ckpt").write_text("my notes")
    with pytest.raises(NotADirectoryError, match=r"commit_dir '.*/ckpt' is a file, not a "
                                                 r"directory.*pass a directory's path"):
        _elastic(tmp_path / "ckpt")
    with pytest.raises(OSError, match=r"commit_dir '.*/ckpt/sub' cannot be created \(Not a "
                                      r"directory"):
        _elastic(tmp_path / "ckpt" / "sub")
    assert (tmp_path / "ckpt").read_text() == "my notes"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any directory")
def test_a_commit_dir_you_cannot_write_is_an_error_before_any_launch(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(PermissionError, match=r"commit_dir '.*/ro' is not writable by you"):
        _elastic(tmp_path / "ro")


def test_a_commit_dir_others_can_write_is_warned_about(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(UserWarning, match=r"can be written by other users: anyone who can write "
                                         r"there can replace the training state.*weights_only"):
        assert _elastic(shared)[0][0] == 3
