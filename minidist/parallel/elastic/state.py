"""``TorchState``: what a commit saves and a restore brings back (Horovod's ``TorchState``).

A commit is the point a failure rolls back to. It holds everything the next step depends
on: the parameters, the optimizer state, the sampler's ``epoch`` and ``position``, the step
count and the user's own fields (Horovod's ``state.epoch``, ``state.batch``...). Because a
failure here kills every rank (see the package docstring), the commit cannot live only in
the ranks' memory as Horovod's does: rank 0 writes it to the rendezvous directory, to a
temporary name and then ``os.replace`` onto ``commit.pt``, so a rank killed in the middle
of writing leaves the previous commit whole (a rename is atomic on POSIX).

Cost of a commit (``elastic_costs.py``): the gather of ZeRO's sharded optimizer state (K Psi bytes
on a ring) plus serialising (2 + K) Psi bytes on rank 0; every k steps, so the overhead
per step is ``t_commit / k``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from ...collectives import broadcast
from .elastic_sampler import ElasticSampler
from .full_state import export_state, import_state

COMMIT_FILE = "commit.pt"


class CommitStore:
    """One commit in ``directory``, replaced atomically."""

    def __init__(self, directory: str | os.PathLike):
        self.path = Path(directory) / COMMIT_FILE

    def save(self, payload: dict) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".commit-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(payload, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        return torch.load(self.path, weights_only=False)

    def step(self) -> int | None:
        """The committed step, or None before the first commit (reads the whole file)."""
        payload = self.load()
        return None if payload is None else int(payload["step"])


class TorchState:
    """The state an elastic run commits and restores.

    ``model``: the module being trained, a ``md.DistributedDataParallel`` or a ``md.ZeRO``;
    ``optimizer``: its torch optimizer (None with ZeRO, which owns one); ``sampler``: an
    ``ElasticSampler``; ``**fields``: anything else to roll back with the model, as
    attributes (``state.seen``). Fields are saved from rank 0, so they must be the same on
    every rank (counters, or records gathered from all ranks)."""

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
            setattr(self, name, value)

    def commit(self, comm) -> None:
        """Save the state now (collective: every rank calls it; ZeRO gathers its shards)."""
        with comm.timeline.span("commit", "elastic"):
            full = export_state(self.model, self.optimizer, comm)
            if comm.rank == 0:
                self.store.save({
                    "step": self.step, "world_size": comm.world_size, "model": full,
                    "sampler": None if self.sampler is None else self.sampler.state_dict(),
                    "fields": {n: getattr(self, n) for n in self.field_names}})

    def restore(self, comm) -> bool:
        """Load the last commit into every rank (re-sharding for this world size); False if
        there is none yet, and nothing changes. Collective: rank 0 decides whether a commit
        exists and tells the others, so no rank can see a commit that rank 0 writes after
        having found none."""
        with comm.timeline.span("restore", "elastic"):
            found = torch.tensor([int(comm.rank == 0 and self.store.path.exists())])
            if not int(broadcast(comm, found, src=0)):
                return False
            payload = self.store.load()
            import_state(self.model, self.optimizer, payload["model"])
            if self.sampler is not None and payload["sampler"] is not None:
                self.sampler.load_state_dict(payload["sampler"])
            self.step = int(payload["step"])
            for name, value in payload["fields"].items():
                setattr(self, name, value)
        return True

    def __repr__(self) -> str:
        return f"TorchState(step={self.step}, sampler={self.sampler!r}, fields={self.field_names})"
