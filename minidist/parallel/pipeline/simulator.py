"""Run action lists against each other as a pipeline would, without any process: does the
schedule finish, is it complete, how much memory does it hold, how big is its bubble?

Stage r may run ``("F", i)`` once stage r - 1 has finished ``("F", i)`` (its activation has
arrived), and ``("B", i)`` once it has run its own ``("F", i)`` and stage r + 1 has finished
``("B", i)`` (the gradient has arrived). Sends never block (the runtime uses isend), so a
stage stops only when the message it needs next is not there. With chunks (interleaved),
chunk c of stage r is virtual stage s = c p + r and the same rules hold between s - 1, s and
s + 1. Each action takes ``f_cost`` or ``b_cost``; a stage is idle whenever it waits, and

    bubble = 1 - (busy time of all stages) / (p x makespan)

which for GPipe and 1F1B with uniform costs is (p - 1) / (m + p - 1) (``costmodel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Key = tuple[int, str, int, int]  # (stage, kind, microbatch, chunk)


@dataclass(frozen=True)
class Event:
    """One action as it ran in the simulation, in cost units."""
    stage: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float

    def as_dict(self) -> dict:
        """The shape ``md.plot_gantt`` and ``md.to_chrome_trace`` draw (times in seconds)."""
        label = f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")
        return {"name": label, "cat": "forward" if self.kind == "F" else "backward",
                "start": self.start, "end": self.end, "bytes": 0, "peer": None,
                "rank": self.stage}


@dataclass(frozen=True)
class Wait:
    """Stage ``stage`` is stuck at its action number ``index``, waiting for ``on_stage`` to
    run ``on_action``; ``never`` when that action is not in ``on_stage``'s list at all;
    ``on_index`` is where ``on_stage`` itself is stuck (its list length if it finished)."""
    stage: int
    index: int
    action: tuple
    on_stage: int
    on_action: tuple
    never: bool
    on_index: int

    def __str__(self) -> str:
        head = f"stage {self.stage} waits at action {self.index} {self.action}"
        if self.on_stage == self.stage:
            return f"{head} for its own {self.on_action}, which comes later in its list"
        if self.never:
            return f"{head} for stage {self.on_stage}'s {self.on_action}, which it never runs"
        return (f"{head} for stage {self.on_stage}'s {self.on_action}, but stage "
                f"{self.on_stage} is itself stuck at its action {self.on_index}")


@dataclass
class Report:
    """What :func:`simulate` found. ``ok`` when there is no error and no deadlock."""
    stages: int
    microbatches: int
    chunks: int
    errors: list[str] = field(default_factory=list)
    deadlock: list[Wait] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)  # peak micro-batches held per stage
    timeline: list[Event] = field(default_factory=list)
    makespan: float = 0.0
    bubble: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and not self.deadlock

    def events(self) -> list[dict]:
        """The timeline as event dicts for ``md.plot_gantt(report.events())``."""
        return [e.as_dict() for e in self.timeline]

    def __str__(self) -> str:
        lines = [f"{self.stages} stages, {self.microbatches} micro-batches, "
                 f"{self.chunks} chunk(s): " + ("ok" if self.ok else "FAILED")]
        lines += [f"  error: {e}" for e in self.errors]
        lines += [f"  deadlock: {w}" for w in self.deadlock]
        if self.ok:
            lines.append(f"  makespan {self.makespan:g}, bubble {self.bubble:.3f}, "
                         f"peak micro-batches in flight per stage {self.in_flight}")
        return "\n".join(lines)


def _normalise(lists, microbatches, chunks) -> tuple[list[list[tuple]], int, int, list[str]]:
    """Actions as (kind, microbatch, chunk); m and v inferred when not given; shape errors."""
    errors: list[str] = []
    out: list[list[tuple]] = []
    for r, acts in enumerate(lists):
        row = []
        for k, a in enumerate(acts):
            ok = (isinstance(a, tuple) and len(a) in (2, 3) and a[0] in ("F", "B")
                  and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                          for x in a[1:]))
            if not ok:
                errors.append(f"stage {r} action {k} is {a!r}; an action is ('F' or 'B', "
                              f"microbatch) or ('F' or 'B', microbatch, chunk)")
                continue
            row.append((a[0], a[1], a[2] if len(a) == 3 else 0))
        out.append(row)
    flat = [a for row in out for a in row]
    m = microbatches if microbatches is not None else 1 + max((a[1] for a in flat), default=0)
    v = chunks if chunks is not None else 1 + max((a[2] for a in flat), default=0)
    return out, m, v, errors


def _completeness(lists: list[list[tuple]], m: int, v: int) -> list[str]:
    """Every (microbatch, chunk) forwarded once, then backwarded once, on every stage."""
    errors = []
    for r, acts in enumerate(lists):
        seen: dict[tuple, int] = {}
        for k, a in enumerate(acts):
            if a[1] >= m or a[2] >= v:
                errors.append(f"stage {r} action {k} {a} is out of range "
                              f"(microbatches={m}, chunks={v})")
            if a in seen:
                errors.append(f"stage {r} runs {a} twice (actions {seen[a]} and {k})")
            seen.setdefault(a, k)
            if a[0] == "B" and seen.get(("F", a[1], a[2]), k + 1) > k:
                errors.append(f"stage {r} backwards micro-batch {a[1]} (chunk {a[2]}) at "
                              f"action {k} before forwarding it")
        for i in range(m):
            for c in range(v):
                for kind in "FB":
                    if (kind, i, c) not in seen:
                        errors.append(f"stage {r} never runs {kind} of micro-batch {i}"
                                      + (f" chunk {c}" if v > 1 else ""))
    return errors


def _needs(r: int, a: tuple, p: int, v: int) -> list[Key]:
    """The actions that must have finished before stage r may run ``a``."""
    kind, i, c = a
    s = c * p + r  # virtual stage
    if kind == "F":
        return [] if s == 0 else [((s - 1) % p, "F", i, (s - 1) // p)]
    own = [(r, "F", i, c)]
    return own if s == p * v - 1 else own + [((s + 1) % p, "B", i, (s + 1) // p)]


def _peaks(lists: list[list[tuple]]) -> list[int]:
    peaks = []
    for acts in lists:
        held = peak = 0
        for kind, _, _ in acts:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def _show(a: tuple, v: int) -> tuple:
    return a if v > 1 else a[:2]


def simulate(action_lists, microbatches: int | None = None, chunks: int | None = None,
             f_cost: float = 1.0, b_cost: float = 1.0, latency: float = 0.0) -> Report:
    """Execute each stage's list in order against the others (see the module docstring).

    Returns a :class:`Report`: errors (malformed, missing, repeated, backward before
    forward), the deadlock if any (who waits at which action on what), peak micro-batches
    in flight per stage, the timeline (``report.events()`` for ``md.plot_gantt``), the
    makespan and the measured bubble. ``latency`` is added to every message between stages.
    """
    if not isinstance(action_lists, (list, tuple)) or not action_lists:
        raise TypeError(f"action_lists must be a non-empty list of per-stage lists, "
                        f"got {action_lists!r}")
    lists, m, v, errors = _normalise(action_lists, microbatches, chunks)
    p = len(lists)
    report = Report(p, m, v, errors=errors)
    if errors:
        return report
    report.errors = _completeness(lists, m, v)
    report.in_flight = _peaks(lists)
    ptr, clock = _run(lists, v, (f_cost, b_cost, latency), report.timeline)
    done = {(e.stage, e.kind, e.microbatch, e.chunk) for e in report.timeline}
    for r in range(p):
        if ptr[r] < len(lists[r]):
            a = lists[r][ptr[r]]
            n = next(n for n in _needs(r, a, p, v) if n not in done)
            report.deadlock.append(Wait(r, ptr[r], _show(a, v), n[0], _show(n[1:], v),
                                        n[1:] not in lists[n[0]], ptr[n[0]]))
    report.makespan = max(clock)
    busy = sum(e.end - e.start for e in report.timeline)
    report.bubble = 1.0 - busy / (p * report.makespan) if report.makespan else 0.0
    return report


def _run(lists: list[list[tuple]], v: int, costs: tuple[float, float, float],
         timeline: list[Event]) -> tuple[list[int], list[float]]:
    """Advance every stage through its list while what it needs next has finished; an
    action starts when its stage is free and its inputs have arrived. Returns how far each
    stage got and when it finished."""
    f_cost, b_cost, latency = costs
    p = len(lists)
    done: dict[Key, float] = {}
    ptr, clock = [0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while ptr[r] < len(lists[r]):
                a = lists[r][ptr[r]]
                needs = _needs(r, a, p, v)
                if any(n not in done for n in needs):
                    break
                ready = max([clock[r]] + [done[n] + (latency if n[0] != r else 0.0)
                                          for n in needs])
                end = ready + (f_cost if a[0] == "F" else b_cost)
                done[(r, *a)] = clock[r] = end
                timeline.append(Event(r, a[0], a[1], a[2], ready, end))
                ptr[r] += 1
                progress = True
    return ptr, clock
