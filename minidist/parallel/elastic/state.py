"""``TorchState``: what a commit saves and a restore brings back (Horovod's ``TorchState``).

A commit is the point a failure rolls back to. It holds everything the next step depends
on: the parameters, the optimizer state, the sampler's ``epoch`` and ``position``, the step
count and the user's own fields (Horovod's ``state.epoch``, ``state.batch``...). Because a
failure here kills every rank (see the package docstring), the commit cannot live only in
the ranks' memory as Horovod's does: rank 0 writes it to the commit directory, to a
temporary name and then ``os.replace`` onto ``commit.pt``, so a rank killed in the middle
of writing leaves the previous commit whole (a rename is atomic on POSIX; the files, their
mode 0600, the safe loading and the fallback to ``commit.prev.pt``: ``commit_store.py``).
A commit therefore holds only tensors and plain types, which ``torch.load(weights_only=True)``
rebuilds without running anything: the fields too (numbers, strings, lists, dicts of them).

Cost of a commit (``costmodel.elastic``): the gather of ZeRO's sharded optimizer state (K Psi bytes
on a ring) plus serialising (2 + K) Psi bytes on rank 0; every k steps, so the overhead
per step is ``t_commit / k``.
"""

from __future__ import annotations

import torch
from torch import nn

from ...collectives import broadcast
from .commit_store import COMMIT_FILE, CommitError, CommitStore, check_plain
from .elastic_sampler import ElasticSampler
from .full_state import export_state, import_state

__all__ = ["COMMIT_FILE", "CommitError", "CommitStore", "TorchState"]


class TorchState:
    """The state an elastic run commits and restores.

    ``model``: the module being trained, a ``md.DistributedDataParallel`` or a ``md.ZeRO``;
    ``optimizer``: its torch optimizer (None with ZeRO, which owns one); ``sampler``: an
    ``ElasticSampler``; ``**fields``: anything else to roll back with the model, as
    attributes (``state.seen``). Fields are saved from rank 0, so they must be the same on
    every rank (counters, or records gathered from all ranks), and plain (tensors, numbers,
    strings, lists and dicts of them: what ``weights_only`` loads; checked here and at each
    commit)."""

    def __init__(self, store: CommitStore, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None = None,
                 sampler: ElasticSampler | None = None, **fields):
        if not isinstance(store, CommitStore):
            raise TypeError(f"store must be a CommitStore (rdzv.store), got "
                            f"{type(store).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, DDP or ZeRO, got {type(model).__name__}")
        if optimizer is None and not hasattr(model, "optimizer"):
            raise ValueError("optimizer is required unless model is an md.ZeRO (which owns "
                             "its optimizer)")
        if sampler is not None and not isinstance(sampler, ElasticSampler):
            raise TypeError(f"sampler must be an md.elastic.ElasticSampler, got "
                            f"{type(sampler).__name__}")
        self.store, self.model, self.sampler = store, model, sampler
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.step = 0
        self.field_names = sorted(fields)
        for name, value in fields.items():
            check_plain(value, f"the field {name!r}")
            setattr(self, name, value)

    def commit(self, comm) -> None:
        """Save the state now (collective: every rank calls it; ZeRO gathers its shards)."""
        with comm.timeline.span("commit", "elastic"):
            full = export_state(self.model, self.optimizer, comm)
            if comm.rank == 0:
                self.store.save({
                    "step": int(self.step), "world_size": comm.world_size, "model": full,
                    "sampler": None if self.sampler is None else self.sampler.state_dict(),
                    "fields": {n: getattr(self, n) for n in self.field_names}})

    def restore(self, comm) -> bool:
        """Load the last commit into every rank (re-sharding for this world size); False if
        there is none yet, and nothing changes. Collective: every rank reads the commit at
        once, then rank 0 says which file it took (none, ``commit.pt``, or ``commit.prev.pt``
        if ``commit.pt`` is damaged) and a rank that took another reads that one, so no rank
        keeps a commit that rank 0 wrote after having found none."""
        with comm.timeline.span("restore", "elastic"):
            files = (None, self.store.path, self.store.prev)
            payload = self.store.load(warn=comm.rank == 0 and self.store.warn)
            mine = files.index(self.store.loaded_from)
            which = int(broadcast(comm, torch.tensor([mine], device=comm.device), src=0))
            if not which:
                return False
            if which != mine:
                payload = self.store.read(files[which])
            import_state(self.model, self.optimizer, payload["model"])
            if self.sampler is not None and payload["sampler"] is not None:
                self.sampler.load_state_dict(payload["sampler"])
            self.step = int(payload["step"])
            for name, value in payload["fields"].items():
                setattr(self, name, value)
        return True

    def __repr__(self) -> str:
        return f"TorchState(step={self.step}, sampler={self.sampler!r}, fields={self.field_names})"
