"""Tests of exercise 03: a parameter server's synchronous step (``sync_step``), the
stale-synchronous admission rule (``ssp_admits``) and, the stretch part, an SSP server
that applies each push at once and holds fast workers back (``ssp_serve``).

Rank 0 runs the learner's server; ranks 1..W are the grader's workers, worker 1 a straggler
(``ps_probe.py``). The references: one process averaging every worker's gradient (sync), the
rule of Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel Parameter
Server" (NIPS 2013) (``ssp_admits``), and every message the server sends or receives, checked
as it happens by the probe. ``md.ParameterServer`` is out of reach while they run
(``sandbox.PARAM_SERVER``), and so are minidist's collectives (the server is built from
point-to-point messages).
"""

from __future__ import annotations

import re
import time

import torch

from ..engine.feedback import Mistake
from ..engine.sandbox import COLLECTIVES, PARAM_SERVER, SENDRECV
from ..engine.spec import GradedTest
from .ps_probe import DELAY, LR, Probe, gradient, initial

RULES = (PARAM_SERVER, COLLECTIVES, SENDRECV)
SYNC_WORLDS, SYNC_STEPS = (3, 2, 4), 3  # world sizes: 2, 1 and 3 workers
SSP_CASES = {3: (0, 1), 4: (0, 1, 2)}  # world size: staleness bounds
SSP_STEPS = 5


def _run_ranks(learner, *args) -> list[list[dict]]:
    """``learner.run_ranks``; a broken protocol (``ps_probe.ProtocolError``) reads as such."""
    try:
        return learner.run_ranks(*args)
    except Mistake as e:  # "sync_step failed on rank 0 at `...` (line 3 of cell 6): Pro..."
        text = re.sub(r" failed on rank 0( at `.*?` \([^)]*\))?: ProtocolError: ",
                      r" broke the protocol\1: ", str(e), count=1)
        raise Mistake(text.replace(" raised ProtocolError", " broke the protocol", 1)) from None


# -- what runs on each rank: the learner's server on rank 0 (watched), the grader's workers ----
def worker_loop(comm, steps: int) -> list[torch.Tensor]:
    """A grader's worker: push, wait for the parameters, ``steps`` times."""
    params, got = initial(), []
    for k in range(steps):
        if comm.rank == 1 and comm.world_size > 2:
            time.sleep(DELAY)  # the straggler
        comm.send(gradient(comm.rank, k), 0)
        comm.recv(params, 0)
        got.append(params.clone())
    return got


def sync_case(comm, namespace, steps: int):
    """Rank 0: ``sync_step`` ``steps`` times; the others: the grader's workers."""
    if comm.rank > 0:
        return worker_loop(comm, steps)
    params, probe = initial(), Probe(comm, steps, LR)
    try:
        for _ in range(steps):
            namespace["sync_step"](comm, params, LR)
            probe.after_sync_step(params)
    finally:
        probe.close()
    return params


def ssp_case(comm, namespace, staleness: int, steps: int):
    """Rank 0: ``ssp_serve`` with the reference rule; the others: the grader's workers."""
    if comm.rank > 0:
        return worker_loop(comm, steps)
    probe = Probe(comm, steps, LR, staleness)
    try:
        namespace["ssp_serve"](comm, initial(), LR, staleness, steps, admits)
        probe.after_serve()
    finally:
        probe.close()
    return {"lead": probe.lead}


def admits(clock: int, clocks, staleness: int) -> bool:
    """The SSP rule (Ho et al., NIPS 2013): a worker at clock c may go if c - min <= s."""
    return clock - min(clocks) <= staleness


# -- the synchronous step ----------------------------------------------------------------------
def check_sync_step(learner) -> str:
    for p in SYNC_WORLDS:
        label = f"world_size={p} (the server and {p - 1} worker(s)), {SYNC_STEPS} steps"
        ranks = _run_ranks(learner, sync_case, p, [(SYNC_STEPS,)], "sync_step", [label])
        want = _sync_trajectory(p - 1)
        for w in range(1, p):
            got = ranks[w][0]["value"]
            for k in range(SYNC_STEPS):
                if not torch.allclose(torch.as_tensor(got[k]), want[k], rtol=1e-12,
                                      atol=1e-12):
                    raise Mistake(f"with {label}: worker {w} received wrong parameters after "
                                  f"step {k + 1}: {got[k]!r:.120}, expected {want[k]}")
    return ("every worker answered once per step, after all the gradients had arrived (taken "
            "with md.ANY_SOURCE, a straggler among them), with params - lr * their average, "
            "on 1, 2 and 3 workers")


def _sync_trajectory(workers: int) -> list[torch.Tensor]:
    params, out = initial(), []
    for k in range(SYNC_STEPS):
        params = params - LR * torch.stack([gradient(w, k) for w in
                                            range(1, workers + 1)]).mean(0)
        out.append(params)
    return out


# -- the admission rule --------------------------------------------------------------------
ADMIT_CASES = [  # (clock, clocks, staleness)
    (0, [0, 0, 0], 0), (1, [1, 0, 1], 0), (1, [1, 1], 0), (2, [2, 1, 1], 1),
    (3, [3, 1, 2], 1), (3, [3, 1, 3], 2), (4, [4, 1, 2, 4], 2), (0, [0, 3, 2], 1),
    (5, [5, 5, 5], 0), (7, [7, 3, 7], 4), (7, [7, 3, 5], 3), (2, [2, 2, 0], 1),
    (1, [1], 0), (4, [4, 2], 3),
]


def check_ssp_admits(learner) -> str:
    labels = [f"clock={c}, clocks={cs}, staleness={s}" for c, cs, s in ADMIT_CASES]
    results = learner.call_each("ssp_admits", [(c, list(cs), s) for c, cs, s in ADMIT_CASES],
                                labels)
    for label, got in zip(labels, results):
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        if not isinstance(got, (bool, int)) or got not in (0, 1):
            raise Mistake(f"with {label}: ssp_admits returned {got!r:.80}, expected True or "
                          "False")
    answers = [bool(got) for got in results]
    for case, label, got in zip(ADMIT_CASES, labels, answers):
        want = admits(*case)
        if got != want:
            raise Mistake(f"with {label}: ssp_admits returned {got}, expected {want}: "
                          f"{_admit_hint(case, got, answers)}")
    return f"the rule of Ho et al. (NIPS 2013) in {len(ADMIT_CASES)} cases"


WRONG_RULES = [  # (a typical wrong rule, what to say when the answers are all its answers)
    (lambda c, cs, s: c - min(cs) < s,
     "the bound is inclusive: a worker exactly s steps ahead may go, c - min(clocks) <= s "
     "(with < and s = 0 nobody ever moves, not even the slowest)"),
    (lambda c, cs, s: c - min(cs) <= s + 1,
     "c - min(clocks) <= s + 1 admits a worker s + 1 steps ahead, one more than the bound"),
    (lambda c, cs, s: max(cs) - c <= s,
     "this measures how far a worker is behind the fastest; the rule bounds how far it is "
     "ahead of the slowest: c - min(clocks) <= s"),
    (lambda c, cs, s: c - max(cs) <= s,
     "compare with min(clocks), the slowest worker: every worker is at most 0 steps ahead of "
     "the fastest, so comparing with max(clocks) admits everyone"),
]


def _admit_hint(case, got: bool, answers: list[bool]) -> str:
    for rule, hint in WRONG_RULES:
        if answers == [rule(*c) for c in ADMIT_CASES]:
            return hint
    clock, clocks, s = case
    lead = clock - min(clocks)
    if got and lead == s + 1:
        return (f"this admits a worker {s + 1} steps ahead of the slowest, one more than the "
                f"bound s = {s}. A worker at clock c may go only if c - min(clocks) <= s; "
                "with s = 0 every worker waits for the slowest: that is the synchronous step")
    if got:
        return (f"this worker is {lead} steps ahead of the slowest (clock {min(clocks)}), more "
                f"than s = {s}: compare with min(clocks), the slowest worker, whoever it is")
    if lead == s:
        return (f"this holds back a worker exactly s = {s} steps ahead; the bound is "
                "inclusive: c - min(clocks) <= s may go")
    if clock == min(clocks):
        return ("the slowest worker must always go: it is the one the others wait for, and "
                "if it is held nobody moves again")
    return (f"this worker is {lead} step(s) ahead of the slowest (clock {min(clocks)}), "
            f"within s = {s}: c - min(clocks) <= s may go")


# -- the SSP server (stretch) ----------------------------------------------------------------
def check_ssp_serve(learner) -> str:
    leads = {}
    for p, bounds in SSP_CASES.items():
        labels = [f"world_size={p} ({p - 1} workers, worker 1 a straggler), staleness={s}, "
                  f"steps={SSP_STEPS}" for s in bounds]
        ranks = _run_ranks(learner, ssp_case, p, [(s, SSP_STEPS) for s in bounds],
                           "ssp_serve", labels)
        want = initial() - LR * sum(gradient(w, k) for w in range(1, p)
                                    for k in range(SSP_STEPS))
        for i, (s, label) in enumerate(zip(bounds, labels)):
            leads[(p, s)] = ranks[0][i]["value"]["lead"]
            last = [torch.as_tensor(ranks[w][i]["value"][-1]) for w in range(1, p)]
            if not any(torch.allclose(t, want, rtol=1e-12, atol=1e-12) for t in last):
                raise Mistake(f"with {label}: no worker received the final parameters "
                              f"{want} (every push applied once); the last replies were "
                              f"{[t.tolist() for t in last]}")
    shown = ", ".join(f"{p - 1} workers and s={s}: {lead}" for (p, s), lead in leads.items())
    return ("each push applied as it came, no worker ever more than s steps ahead of the "
            f"slowest, none held once the rule let it go (largest lead seen: {shown})")


TESTS = [  # in notebook order
    GradedTest("test_sync_step", 4, ("sync_step",), check_sync_step, RULES),
    GradedTest("test_ssp_admits", 2, ("ssp_admits",), check_ssp_admits, RULES),
    GradedTest("test_ssp_serve", 4, ("ssp_serve",), check_ssp_serve, RULES, part="stretch"),
]
