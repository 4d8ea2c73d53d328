"""Pipeline schedules as data: each stage's ordered list of forward and backward actions.

A schedule is nothing but, for every stage r, the order in which it runs the forward ("F")
and backward ("B") pass of each micro-batch. The runtime (``runtime.py``) executes any such
list; the simulator (``simulator.py``) checks one and measures its bubble. Keeping the two
apart is what lets a learner write a schedule and test it without a single process.

    actions("1f1b", stages=4, microbatches=8)[3]
    # [("F", 0), ("B", 0), ("F", 1), ("B", 1), ...]

An action is ``(kind, microbatch)``, or ``(kind, microbatch, chunk)`` when a stage holds
several model chunks (the interleaved schedule; chunk c of stage r is virtual stage c p + r).

The bubble, the idle share of a step with p stages, m micro-batches and v chunks per stage,
is (p - 1) / (v m + p - 1) for GPipe, 1F1B and interleaved alike
(``md.costmodel.bubble_fraction``); they differ
in how many micro-batches' activations a stage holds at once (:func:`peak_in_flight`).
"""

from __future__ import annotations

from ...checks import positive_int

Action = tuple  # ("F" | "B", microbatch) or ("F" | "B", microbatch, chunk)

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved")


def naive(stages: int, microbatches: int) -> list[list[Action]]:
    """The model split over stages with no pipelining: each micro-batch goes all the way
    forward and all the way back before the next one starts, so p - 1 of the p stages idle
    at any moment (bubble (p - 1) / p, whatever m). With one micro-batch this is plain model
    parallelism; with more it is gradient accumulation on a split model."""
    return [[a for i in range(microbatches) for a in (("F", i), ("B", i))]
            for _ in range(stages)]


def gpipe(stages: int, microbatches: int) -> list[list[Action]]:
    """GPipe (Huang et al. 2019): every stage runs all m forwards, then all m backwards.
    Bubble (p - 1) / (m + p - 1); each stage holds the activations of all m micro-batches
    at the turn, which is what 1F1B fixes. Backwards in micro-batch order, as torch's
    ``ScheduleGPipe`` does."""
    return [[("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
            for _ in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> list[list[Action]]:
    """1F1B, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
    Training"): stage r warms up with p - r - 1 forwards, then alternates one forward and
    one backward, then cools down with the remaining backwards. The same bubble as GPipe,
    (p - 1) / (m + p - 1), but stage r never holds more than p - r micro-batches (not m)."""
    out = []
    for r in range(stages):
        warmup = min(stages - r - 1, microbatches)
        acts: list[Action] = [("F", i) for i in range(warmup)]
        for i in range(warmup, microbatches):  # steady state: one forward, one backward
            acts += [("F", i), ("B", i - warmup)]
        acts += [("B", i) for i in range(microbatches - warmup, microbatches)]  # cool-down
        out.append(acts)
    return out


def _interleaved_order(stages: int, microbatches: int, chunks: int,
                       backward: bool) -> list[tuple[int, int]]:
    """Megatron-LM's order of (microbatch, chunk) pairs on every stage: groups of p
    micro-batches go through chunk 0, then chunk 1, ...; backwards visit chunks in reverse."""
    order = []
    for k in range(microbatches * chunks):
        group = k // stages
        chunk = group % chunks
        if backward:
            chunk = chunks - 1 - chunk
        order.append(((k // (stages * chunks)) * stages + k % stages, chunk))
    return order


def interleaved(stages: int, microbatches: int, chunks: int) -> list[list[Action]]:
    """Interleaved 1F1B (Narayanan et al., SC 2021, section 2.2, Megatron-LM): each stage
    holds v chunks of the model (chunk c of stage r is layer group c p + r), so a
    micro-batch loops v times round the stages in smaller steps. Stage r warms up with
    2 (p - r - 1) + (v - 1) p forwards. The bubble shrinks by v, (p - 1) / (v m + p - 1),
    for v times as many messages. Needs m to be a multiple of p, as in Megatron-LM."""
    if microbatches % stages:
        raise ValueError(f"the interleaved schedule needs microbatches to be a multiple of "
                         f"stages, got microbatches={microbatches}, stages={stages}")
    fwd = _interleaved_order(stages, microbatches, chunks, backward=False)
    bwd = _interleaved_order(stages, microbatches, chunks, backward=True)
    total = microbatches * chunks
    out = []
    for r in range(stages):
        warmup = min(2 * (stages - r - 1) + (chunks - 1) * stages, total)
        acts: list[Action] = [("F", *fwd[k]) for k in range(warmup)]
        for k in range(warmup, total):
            acts += [("F", *fwd[k]), ("B", *bwd[k - warmup])]
        acts += [("B", *bwd[k]) for k in range(total - warmup, total)]
        out.append(acts)
    return out


def actions(name: str, stages: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """Each stage's ordered actions for schedule ``name`` ("naive", "gpipe", "1f1b",
    "interleaved"): a list of ``stages`` lists of ``("F" | "B", microbatch)`` tuples
    (``("F" | "B", microbatch, chunk)`` for "interleaved"). ``md.pipeline.simulate`` checks
    and times them; ``md.ScheduleGPipe`` / ``md.Schedule1F1B`` run them."""
    p = positive_int(stages, "stages", TypeError)
    m = positive_int(microbatches, "microbatches", TypeError)
    v = positive_int(chunks, "chunks", TypeError)
    if not isinstance(name, str) or name.lower() not in SCHEDULES:
        raise ValueError(f"unknown schedule name={name!r}; choose one of {SCHEDULES}")
    name = name.lower()
    if name != "interleaved" and v != 1:
        raise ValueError(f"chunks={v} needs the 'interleaved' schedule, not {name!r}")
    if name == "naive":
        return naive(p, m)
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    return interleaved(p, m, v)


def peak_in_flight(name: str, stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at most under ``name``:
    GPipe m, 1F1B min(p - r, m), naive 1."""
    name = name.lower()
    if name == "gpipe":
        return microbatches
    if name == "1f1b":
        return min(stages - stage, microbatches)
    if name == "naive":
        return 1
    raise ValueError(f"peak_in_flight knows 'naive', 'gpipe' and '1f1b', got name={name!r}")
