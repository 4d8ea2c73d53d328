"""Stage 2 (and 3): gradients reduce-scattered into the owning shard during backward.

With stage 1 every rank still holds a full gradient until ``step``, reduce-scatters it
there and keeps only its shard: the memory of the gradient is gone only between steps. ZeRO
stage 2 (P_os+g, Rajbhandari et al. SC 2020, section 5.2) never lets the full gradient
pile up: as soon as backward has produced the gradients of one bucket (a group of
parameters laid out as ``FlatShards``), the bucket is packed, divided by p,
reduce-scattered, and rank r adds the r-th piece to its persistent gradient shard; the
full gradients of the bucket are then dropped (``param.grad = None``). At most one bucket
of full gradients is alive at a time beyond what autograd itself holds.

Why not the data-parallel ``BucketScheduler`` with a ``BucketReduction`` (``minidist/
parallel/data/reductions.py``)? Its ``Bucket`` keeps a full-size flat buffer per bucket
for the wrapper's lifetime (that is how DDP avoids reallocating), so the bytes this rank
holds would stay 1 Psi of gradients: exactly what stage 2 exists to remove. Its buckets
are also unpadded, so their reduce-scatter pieces would not be equal. The mechanism here is
the same one (post-accumulate-grad hooks, buckets launched strictly in index order so all
ranks issue the same collectives, a callback at the end of backward for what is left) on
buckets that own no memory between steps.

The reduce-scatters run on the caller's thread inside backward, except with stage 3's
prefetch, where they join the gathers on one communication thread (``param_units.py``).

Parameters that got no gradient in a backward pass (unused, or zero-sized) count as zero
when the pass ends. Several backward passes before one ``step`` add up in the shard
(gradient accumulation; each pass costs one reduce-scatter).

Communication per step: one reduce-scatter of the padded model, (p - 1)/p * Psi elements
sent per rank; with stage 1's all-gather afterwards the total is the 2 Psi of one
all-reduce (``costmodel.zero.zero_step_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...collectives import reduce_scatter
from ..data.graph import at_backward_end
from .flat_shards import FlatShards


class BackwardCounter:
    """Stages 0 and 1: gradients accumulate in place in ``param.grad``; this only notes that
    a backward pass reached the parameters, so ``step`` can refuse to run without one."""

    def __init__(self, params):
        self.backwards = 0
        self._armed = False
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def _on_grad(self, _p) -> None:
        if not self._armed:
            self._armed = True
            at_backward_end(self._finish)

    def _finish(self) -> None:
        self._armed = False
        self.backwards += 1


class GradientShards:
    """Reduce-scatters each group's gradients into ``grad_shards[k]`` as backward produces
    them. ``on_reduced(k)`` runs after group k is reduced (stage 3 frees its parameters
    there). ``backwards`` counts finished backward passes since ``step`` last reset it."""

    def __init__(self, comm, groups: list[FlatShards], grad_shards: list[torch.Tensor],
                 on_reduced: Callable[[int], None] | None = None, thread=None):
        self.comm, self.groups, self.grad_shards = comm, groups, grad_shards
        self.on_reduced = on_reduced
        self.thread = thread  # a CommThread: reduce there (in order) while backward goes on
        self.futures: list = []
        self.where = {id(p): k for k, g in enumerate(groups) for p in g.params}
        self.names = {id(p): f"group {k} parameter {i}" for k, g in enumerate(groups)
                      for i, p in enumerate(g.params)}
        self.backwards = 0
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                         for g in groups for p in g.params]

    def _reset(self) -> None:
        self.ready: set[int] = set()
        self.pending = [len(g.params) for g in self.groups]
        self.next_group = 0
        self.armed = False

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.armed:
            self.armed = True
            at_backward_end(self._finish)
        if id(p) in self.ready:
            raise RuntimeError(
                f"ZeRO: {self.names[id(p)]} got its gradient twice in one backward pass "
                "(reentrant checkpointing or a retained graph run backward twice); its bucket "
                "was already reduce-scattered. Checkpoint with use_reentrant=False")
        self.ready.add(id(p))
        k = self.where[id(p)]
        self.pending[k] -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        """Reduce every complete group, strictly in index order: group k + 1 waits for k,
        so every rank issues the same collectives in the same order."""
        while self.next_group < len(self.groups) and self.pending[self.next_group] == 0:
            self._reduce(self.next_group)
            self.next_group += 1

    def _reduce(self, k: int) -> None:
        if self.thread is None:
            self._reduce_now(k)
        else:
            self.futures.append(self.thread.submit(lambda: self._reduce_now(k)))

    def _reduce_now(self, k: int) -> None:
        group = self.groups[k]
        with self.comm.timeline.span(f"reduce-scatter {k}"):
            flat = group.pack([p.grad for p in group.params])
            piece = reduce_scatter(self.comm, flat, op="avg") if group.padded else flat
            self.grad_shards[k].add_(piece)
        del flat
        for p in group.params:  # the full gradients are not needed any more
            p.grad = None
        if self.on_reduced is not None:
            self.on_reduced(k)

    def _finish(self) -> None:
        """End of the backward pass: groups whose parameters got no gradient (all or some)
        are reduced now, with zeros standing in."""
        try:
            for k in range(self.next_group, len(self.groups)):
                self._reduce(k)
        finally:
            futures, self.futures = self.futures, []
            errors = [f.exception() for f in futures]  # waits for every one
            for f in futures:  # the end of backward waits for the last of them
                self.thread.clock.at_least(f.finished_at)
            self.backwards += 1
            self._reset()
        if any(errors):
            raise next(e for e in errors if e)
