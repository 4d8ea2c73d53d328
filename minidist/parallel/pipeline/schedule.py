"""The runtime: a stage executes its action list, micro-batch by micro-batch.

    stage = md.PipelineStage(submodule, comm)
    sched = md.Schedule1F1B(stage, n_microbatches=8, loss_fn=md.models.lm_loss)
    sched.step(x)                             # first stage: the whole batch
    sched.step()                              # middle stages
    sched.step(target=y, losses=losses)       # last stage: targets, and a list for the losses

Any action list runs: the named schedules (``ScheduleNaive``, ``ScheduleGPipe``,
``Schedule1F1B``, ``ScheduleInterleaved1F1B``) take theirs from ``md.pipeline.actions``, and
``PipelineSchedule(stage, m, loss_fn, schedule=lists)`` runs one written by hand, once
``md.pipeline.simulate`` has found it complete and deadlock-free (a bad list is a ValueError
naming the deadlock, never a hang). For the interleaved schedule a rank passes its v virtual
stages, ``[PipelineStage(chunk_c, comm, c * p + rank, v * p) for c in range(v)]``, as
torch's ``ScheduleInterleaved1F1B`` takes them.

The batch is cut along dim 0 with ``torch.tensor_split`` (as torch does), so the last
micro-batch may be smaller. The loss of micro-batch i, of n_i samples out of N, is scaled by
n_i / N before its backward: with a loss that is a mean over the batch, the gradients
accumulated over the m micro-batches are exactly the full batch's mean gradient. The step
costs the ideal m (t_f + t_b) plus the bubble, an idle share (p - 1) / (m + p - 1) of it
(``md.costmodel.bubble_fraction``); ``md.pipeline.measured_bubble`` reads it off the timeline.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...checks import positive_int, tensor
from ...costmodel import bubble_fraction
from .schedules import actions
from .simulator import simulate
from .stage import PipelineStage


def _check_lists(lists, p: int, m: int, v: int) -> list[list[tuple]]:
    """A hand-written schedule: one list per rank, complete and deadlock-free."""
    if not isinstance(lists, (list, tuple)) or len(lists) != p:
        n = len(lists) if isinstance(lists, (list, tuple)) else type(lists).__name__
        raise ValueError(f"schedule must hold one action list per stage: comm.world_size="
                         f"{p} stages but got {n}")
    report = simulate(lists, microbatches=m, chunks=v)
    if not report.ok:
        raise ValueError(f"schedule is not runnable:\n{report}")
    return lists


def _check_stages(stage) -> list[PipelineStage]:
    """This rank's stages: one, or its v virtual stages c * p + rank in chunk order."""
    stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]
    if not stages or not all(isinstance(s, PipelineStage) for s in stages):
        raise TypeError(f"stage must be an md.PipelineStage or a list of them, got {stage!r}")
    comm, v = stages[0].comm, len(stages)
    p = comm.world_size
    for c, s in enumerate(stages):
        if s.comm is not comm or s.stage_index != c * p + comm.rank or s.num_stages != v * p:
            raise ValueError(f"chunk {c} of rank {comm.rank} must be stage {c * p + comm.rank} "
                             f"of {v * p} on the same comm, got {s!r}")
    return stages


class PipelineSchedule:
    """Runs this rank's share of ``schedule`` (a name for ``md.pipeline.actions`` or one
    action list per rank) for ``n_microbatches`` micro-batches per :meth:`step`.

    ``after_backward(stage)``, if given, runs once per step right after this rank's last
    backward: the place for a data-parallel gradient all-reduce, which must see the
    gradients of all m micro-batches, not one."""

    schedule = "1f1b"

    def __init__(self, stage, n_microbatches: int, loss_fn: Callable | None = None,
                 schedule=None, after_backward: Callable | None = None):
        self.stages = _check_stages(stage)
        self.stage = stage
        self.n_microbatches = positive_int(n_microbatches, "n_microbatches")
        self.is_first, self.is_last = self.stages[0].is_first, self.stages[-1].is_last
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage needs loss_fn(output, target)")
        self.loss_fn, self.after_backward = loss_fn, after_backward
        comm, m, v = self.stages[0].comm, self.n_microbatches, len(self.stages)
        schedule = self.schedule if schedule is None else schedule
        lists = actions(schedule, comm.world_size, m, v) if isinstance(schedule, str) \
            else _check_lists(schedule, comm.world_size, m, v)
        self.actions: list[tuple] = [(a[0], a[1], a[2] if len(a) == 3 else 0)
                                     for a in lists[comm.rank]]
        self._name = schedule if isinstance(schedule, str) else None
        self._lists, self._signature = lists, None

    def predicted_bubble(self) -> float:
        """The idle share of a step with equal stage costs: (p - 1) / (v m + p - 1) for
        GPipe, 1F1B and interleaved (``md.costmodel.bubble_fraction``), (p - 1) / p for
        the naive split; for a hand-written list, what ``md.pipeline.simulate`` finds."""
        p, m, v = self.stages[0].comm.world_size, self.n_microbatches, len(self.stages)
        if self._name == "naive":
            return (p - 1) / p
        if self._name is not None:
            return bubble_fraction(p, m, v)
        return simulate(self._lists, microbatches=m, chunks=v).bubble

    def _split(self, t, what: str) -> list[torch.Tensor]:
        tensor(t, what)
        if t.dim() == 0 or t.shape[0] < self.n_microbatches:
            raise ValueError(f"{what} of shape {tuple(t.shape)} cannot be split into "
                             f"n_microbatches={self.n_microbatches} along dim 0")
        return list(torch.tensor_split(t, self.n_microbatches))

    def _inputs(self, args, target) -> tuple[list | None, list | None]:
        s = self.stages[0]
        if self.is_first != (len(args) == 1) or len(args) > 1:
            want = "step(x)" if self.is_first else "no input: step() or step(target=y)"
            raise ValueError(f"stage {s.stage_index} of {s.num_stages} takes {want}, "
                             f"got {len(args)} positional argument(s)")
        if self.is_last != (target is not None):
            want = "needs" if self.is_last else "takes no"
            raise ValueError(f"stage {s.stage_index} of {s.num_stages} {want} target=")
        xs = self._split(args[0], "the input") if self.is_first else None
        ys = self._split(target, "target") if self.is_last else None
        return xs, ys

    def step(self, *args, target=None, losses: list | None = None):
        """One pipelined step over the batch. Returns the last stage's output (the
        micro-batches' outputs concatenated, detached), None on the other stages; appends
        each micro-batch's loss (unscaled) to ``losses`` on the last stage."""
        xs, ys = self._inputs(args, target)
        m = self.n_microbatches
        changed = False
        if xs is not None:
            sig = tuple((tuple(x.shape), x.dtype) for x in xs)
            changed, self._signature = sig != self._signature, sig
        for c, stage in enumerate(self.stages):
            stage.begin_step(changed and c == 0)
        total = sum(len(y) for y in ys) if ys is not None else 0
        outs, mb_losses, scaled = [None] * m, [None] * m, {}
        upcoming = [[i for kind, i, c in self.actions if kind == "F" and c == chunk]
                    for chunk in range(len(self.stages))]
        for chunk, stage in enumerate(self.stages):
            if upcoming[chunk]:
                stage.prefetch(upcoming[chunk][0])
        for kind, i, c in self.actions:
            stage = self.stages[c]
            if kind == "B":
                stage.backward(i, scaled.pop(i, None) if stage.is_last else None)
                continue
            out = stage.forward(i, xs[i] if stage.is_first else None)
            upcoming[c].pop(0)
            if upcoming[c]:
                stage.prefetch(upcoming[c][0])
            if stage.is_last:
                loss = self.loss_fn(out, ys[i])
                scaled[i] = loss * (len(ys[i]) / total)
                mb_losses[i], outs[i] = loss.detach(), out.detach()
        if self.after_backward is not None:
            self.after_backward(self.stage)
        for stage in self.stages:
            stage.end_step()
        if losses is not None and ys is not None:
            losses.extend(mb_losses)
        return torch.cat(outs) if ys is not None else None


class ScheduleNaive(PipelineSchedule):
    """The model split with no overlap: each micro-batch goes all the way forward and back
    before the next starts; p - 1 of p stages idle, bubble (p - 1) / p whatever m. With
    ``n_microbatches=1``, plain model parallelism."""
    schedule = "naive"


class ScheduleGPipe(PipelineSchedule):
    """GPipe (Huang et al. 2019): all forwards, then all backwards. Bubble
    (p - 1) / (m + p - 1); every stage holds the activations of all m micro-batches."""
    schedule = "gpipe"


class Schedule1F1B(PipelineSchedule):
    """1F1B, PipeDream-Flush (Narayanan et al. 2021): p - r - 1 warm-up forwards on stage r,
    then one forward, one backward. GPipe's bubble (p - 1) / (m + p - 1), but stage r holds
    at most p - r micro-batches."""
    schedule = "1f1b"


class ScheduleInterleaved1F1B(PipelineSchedule):
    """Interleaved 1F1B (Narayanan et al., SC 2021, Megatron-LM): each rank holds v model
    chunks (pass the list of its v virtual stages); bubble (p - 1) / (v m + p - 1), v times
    as many messages. m must be a multiple of p."""
    schedule = "interleaved"
