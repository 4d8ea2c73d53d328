"""Exercise 03's tests: the workers' parameters after every synchronous step, the admission
rule on its cases, and the SSP server's final parameters (its protocol is watched as it
runs, on rank 0: ``ranks.Probe``)."""

from __future__ import annotations

import re

import torch

from ...engine.compare import close
from ...engine.feedback import Mistake
from .mistakes import admit_hint
from .ranks import LR, TOLERANCE, admits, gradient, initial, ssp_case, sync_case

SYNC_STEPS = 3
SYNC_WORLDS = {p: [(SYNC_STEPS,)] for p in (3, 2, 4)}  # world sizes: 2, 1 and 3 workers
SSP_STEPS = 5
SSP_WORLDS = {p: [(s, SSP_STEPS) for s in bounds]  # world size: staleness bounds
              for p, bounds in {3: (0, 1), 4: (0, 1, 2)}.items()}
ADMIT_CASES = [  # (clock, clocks, staleness)
    (0, [0, 0, 0], 0), (1, [1, 0, 1], 0), (1, [1, 1], 0), (2, [2, 1, 1], 1),
    (3, [3, 1, 2], 1), (3, [3, 1, 3], 2), (4, [4, 1, 2, 4], 2), (0, [0, 3, 2], 1),
    (5, [5, 5, 5], 0), (7, [7, 3, 7], 4), (7, [7, 3, 5], 3), (2, [2, 2, 0], 1),
    (1, [1], 0), (4, [4, 2], 3),
]


def _protocol(text: str, *_) -> str:
    """A broken protocol (``ranks.ProtocolError``) reads as such: "sync_step failed on rank 0
    at `...` (line 3 of cell 6): ProtocolError: ..." becomes "sync_step broke the protocol
    at ...: ..."."""
    text = re.sub(r" failed on rank 0( at `.*?` \([^)]*\))?: ProtocolError: ",
                  r" broke the protocol\1: ", text, count=1)
    return text.replace(" raised ProtocolError", " broke the protocol", 1)


# -- the synchronous step ----------------------------------------------------------------------
def _sync_label(p: int, steps: int) -> str:
    return f"world_size={p} (the server and {p - 1} worker(s)), {steps} steps"


def check_sync_step(learner) -> str:
    for p, _, label, results in learner.each_world(sync_case, "sync_step", SYNC_WORLDS,
                                                   _sync_label, _protocol):
        want = _sync_trajectory(p - 1)
        for w in range(1, p):
            got = results[w]["value"]
            for k in range(SYNC_STEPS):
                if not close(torch.as_tensor(got[k]), want[k], TOLERANCE):
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
                          f"{admit_hint(case, got, answers, ADMIT_CASES)}")
    return f"the rule of Ho et al. (NIPS 2013) in {len(ADMIT_CASES)} cases"


# -- the SSP server (stretch) ----------------------------------------------------------------
def _ssp_label(p: int, s: int, steps: int) -> str:
    return (f"world_size={p} ({p - 1} workers, worker 1 a straggler), staleness={s}, "
            f"steps={steps}")


def check_ssp_serve(learner) -> str:
    leads = {}
    for p, (s, _), label, results in learner.each_world(ssp_case, "ssp_serve", SSP_WORLDS,
                                                        _ssp_label, _protocol):
        want = initial() - LR * sum(gradient(w, k) for w in range(1, p)
                                    for k in range(SSP_STEPS))
        leads[(p, s)] = results[0]["value"]["lead"]
        last = [torch.as_tensor(results[w]["value"][-1]) for w in range(1, p)]
        if not any(close(t, want, TOLERANCE) for t in last):
            raise Mistake(f"with {label}: no worker received the final parameters "
                          f"{want} (every push applied once); the last replies were "
                          f"{[t.tolist() for t in last]}")
    shown = ", ".join(f"{p - 1} workers and s={s}: {lead}" for (p, s), lead in leads.items())
    return ("each push applied as it came, no worker ever more than s steps ahead of the "
            f"slowest, none held once the rule let it go (largest lead seen: {shown})")
