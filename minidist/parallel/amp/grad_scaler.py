"""``md.GradScaler``: dynamic loss scaling, torch.amp.GradScaler's schedule, agreed across ranks.

Why scale the loss (Micikevicius et al., "Mixed Precision Training", ICLR 2018, section 3.2):
float16 has 10 mantissa bits and 5 exponent bits, so its smallest subnormal is 2^-24 ~ 6e-8
and the smallest normal 2^-14 ~ 6e-5. Many activation gradients of a trained network are
smaller than that and round to zero in float16. Multiplying the loss by S before backward
multiplies every gradient by S (the chain rule is linear), moving them into float16's range;
dividing by S again in float32, just before the optimizer step, gives back the true gradient.

Dynamic schedule (torch.amp.GradScaler, Apex's ``DynamicLossScaler``, DeepSpeed's fp16
optimizer): start at ``init_scale`` = 2^16. Each step, after unscaling, look for inf/NaN in
the gradients (``found_inf``):

* found: the step is skipped (the optimizer does not run) and S <- S * ``backoff_factor``;
* ``growth_interval`` clean steps in a row: S <- S * ``growth_factor`` (only if the new scale
  is finite), and the count starts again.

So S hovers just below the largest scale that does not overflow. bfloat16 (Kalamkar et al.,
"A Study of BFLOAT16 for Deep Learning Training", 2019) keeps float32's 8 exponent bits, has
float32's range, and needs no scaling. It still needs the check: a NaN (a bad sample, a log
of 0, a division by zero) is a NaN in any format, and a step taken on it makes the weights
NaN. ``GradScaler(comm, loss_scaling=False)`` is that check alone (below).

Distributed agreement. Every rank must skip the same steps. After DDP's all-reduce the
gradients are bitwise the same on every rank, so a local check agrees for free; but a rank
that holds *different* gradients (its ZeRO shard, its tensor-parallel slice, its pipeline
stage) checks only its own: one rank overflows and skips, the others step, their scales part
ways, and the replicas diverge for good. With ``comm`` (a communicator, a list of them, or a
``DeviceMesh``: every dimension's group) ``found_inf`` is all-reduced with ``max`` before
the decision: one float32 flag per communicator, latency-bound, ceil(lg p) (alpha + 4 beta)
by recursive doubling (``agreement_cost``): microseconds, against a step of milliseconds.

Cost of the schedule itself: unscaling reads and writes every gradient once (2 x 4 bytes
per float32 gradient) and the inf check reads it once more; on a GPU torch fuses both in
``_amp_foreach_non_finite_check_and_unscale_``, here it is written out in Python.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ...checks import positive_int, positive_number
from .inf_agreement import agree_found_inf, communicators

READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's behaviour, plus ``comm=``.

    ``scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()``. The methods,
    their order rules and their errors are torch's (``unscale_`` twice, ``step`` twice, or
    ``update`` with no step raise). ``get_scale()`` is the current S; ``state_dict`` /
    ``load_state_dict`` save and restore the schedule. Extras: ``skipped_steps`` (steps
    skipped so far), ``skipped_at`` (which updates, counted from 0, skipped their step; of
    ``updates`` so far), ``found_inf`` (the last agreed decision), ``comms``. One difference:
    torch creates S lazily on the loss's device at the first ``scale()`` and refuses to
    ``step`` before it; here S exists from the start, so a pipeline stage that never sees
    the loss can still unscale, agree and step (its gradients came scaled from the next
    stage).

    ``comm``: None (decide alone), a communicator, a list of communicators, or a
    ``DeviceMesh`` (all of its dimensions). Every rank in those groups must call
    ``unscale_``/``step`` together: it is collective. With a ``MasterWeightOptimizer`` the
    16-bit gradients are first copied into the float32 master gradients and unscaled there
    (Micikevicius et al. 2018: unscale in float32, not in float16).

    ``loss_scaling=False`` (bfloat16): the scale stays 1, ``scale(loss)`` returns ``loss``
    itself, ``unscale_`` divides nothing but still checks every gradient for inf/NaN and
    agrees over ``comms``, ``step`` skips on every rank when any rank found one, ``update``
    moves no scale. Why this name: torch's ``enabled=False`` is a pass-through (no check, no
    skip); torch's degenerate form (``init_scale=1``, growth and backoff factors of 1) is
    refused by torch's own checks (growth_factor > 1, backoff_factor < 1), and here;
    ``scale=False`` would shadow the ``scale()`` method; an option on ``MixedPrecision``
    would not reach ``md.ZeRO`` or a pipeline stage's optimizer, which take a scaler.
    ``loss_scaling=False`` sits next to torch's ``enabled`` and names the one part off."""

    def __init__(self, comm=None, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True, loss_scaling: bool = True):
        _check_schedule(init_scale, growth_factor, backoff_factor, growth_interval)
        self.comms = communicators(comm)
        self.enabled, self.loss_scaling = bool(enabled), bool(loss_scaling)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        first = float(init_scale) if self.loss_scaling else 1.0
        self._scale = torch.full((), first, dtype=torch.float32)
        self._growth_tracker = 0
        self._stages: dict[int, str] = {}
        self._found: dict[int, bool] = {}
        self.skipped_steps, self.updates = 0, 0
        self.skipped_at: list[int] = []  # the updates whose step was skipped
        self.found_inf = False

    # -- the three calls of a step ----------------------------------------------------------
    def scale(self, outputs):
        """``outputs * S`` (a tensor, or a list/tuple of them). The product is float32 for a
        16-bit 0-dim loss, as in torch, so the backward starts from S in float32. Without
        loss scaling (or disabled): ``outputs`` themselves."""
        if not (self.enabled and self.loss_scaling):
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self._scale.to(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a Tensor or an iterable of Tensors, got "
                         f"{type(outputs).__name__}")

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by S in place (not without loss scaling) and
        decide ``found_inf`` (agreed over ``comms``). Call it before clipping gradients;
        ``step`` calls it otherwise."""
        if not self.enabled:
            return
        _check_optimizer(optimizer)
        stage = self._stages.get(id(optimizer), READY)
        if stage == UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update().")
        if stage == STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = gradients_to_unscale(optimizer, divide=self.loss_scaling)
        if self.loss_scaling:
            local = unscale_and_check(grads, float(self._scale.double().reciprocal().float()))
        else:
            local = any_nonfinite(grads)
        found = self.agree(local)  # collective: even if this rank has no gradients
        if grads:  # torch records no check for an optimizer without gradients
            self._found[id(optimizer)] = found
        self._stages[id(optimizer)] = UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale (if not done yet), then run ``optimizer.step()`` unless ``found_inf``:
        an overflowed step is skipped, on every rank of ``comms`` alike. Returns what
        ``optimizer.step`` returned, or None for a skipped step."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        if self._stages.get(id(optimizer), READY) == STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if self._stages.get(id(optimizer), READY) == READY:
            self.unscale_(optimizer)
        if id(optimizer) not in self._found:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        self._stages[id(optimizer)] = STEPPED
        if self._found[id(optimizer)]:
            skip = getattr(optimizer, "skip_master_update", None)  # MasterWeightOptimizer
            if skip is not None:
                skip()
            return None
        apply = getattr(optimizer, "apply_master_update", None)  # MasterWeightOptimizer
        return apply(*args, **kwargs) if apply is not None else optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Move S along the schedule (torch's ``_amp_update_scale_``): back off after an
        overflow, grow after ``growth_interval`` clean steps in a row. ``new_scale`` sets S
        directly instead. Without loss scaling S stays 1 (only the skip is recorded)."""
        if not self.enabled:
            return
        if new_scale is not None:
            self._scale.fill_(self._new_scale(new_scale))
        else:
            if not self._found:
                raise AssertionError("No inf checks were recorded prior to update.")
            self._record(any(self._found.values()))
            if self.loss_scaling:
                scale, self._growth_tracker = next_scale(
                    float(self._scale), self._growth_tracker, self.found_inf,
                    self.growth_factor, self.backoff_factor, self.growth_interval)
                self._scale.fill_(scale)
        self._stages, self._found = {}, {}

    def _record(self, found_inf: bool) -> None:
        """Keep the agreed decision of this update: ``found_inf``, the count, the history."""
        self.found_inf = found_inf
        if found_inf:
            self.skipped_steps += 1
            self.skipped_at.append(self.updates)
        self.updates += 1

    def _new_scale(self, new_scale) -> float:
        scale = _as_scale(new_scale)
        if not self.loss_scaling and scale != 1.0:
            raise ValueError(f"this GradScaler has loss_scaling=False (its scale is always 1); "
                             f"it cannot take scale {scale:g}. Build it with "
                             "loss_scaling=True to scale the loss")
        return scale

    # -- agreement, state -------------------------------------------------------------------
    def agree(self, found: bool) -> bool:
        """``found_inf`` on any rank of any of ``comms`` -> True on all of them (all_reduce
        max of one float32 per communicator, in order; collective)."""
        return agree_found_inf(self.comms, found)

    def get_scale(self) -> float:
        """The current loss scale S (1.0 when disabled or without loss scaling)."""
        return float(self._scale) if self.enabled else 1.0

    def is_enabled(self) -> bool:
        return self.enabled

    def get_growth_tracker(self) -> int:
        """Clean steps in a row since the last growth or backoff."""
        return self._growth_tracker

    def state_dict(self) -> dict:
        """torch's keys: scale, growth_factor, backoff_factor, growth_interval,
        _growth_tracker (empty when disabled)."""
        if not self.enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self.enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                   "_growth_tracker"} - set(state_dict)
        if missing:
            raise KeyError(f"GradScaler state_dict is missing {sorted(missing)}")
        _check_schedule(state_dict["scale"], state_dict["growth_factor"],
                        state_dict["backoff_factor"], state_dict["growth_interval"])
        self._scale.fill_(self._new_scale(float(state_dict["scale"])))
        self.growth_factor = float(state_dict["growth_factor"])
        self.backoff_factor = float(state_dict["backoff_factor"])
        self.growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])

    def __repr__(self) -> str:
        scaling = (f"scale={self.get_scale():g}, growth_tracker={self._growth_tracker}"
                   f"/{self.growth_interval}" if self.loss_scaling else "loss_scaling=False")
        return (f"GradScaler({scaling}, skipped_steps={self.skipped_steps}, "
                f"comms={len(self.comms)})")


# -- the schedule and the check, as plain functions (the exercise rebuilds these) ------------
def next_scale(scale: float, tracker: int, found_inf: bool, growth_factor: float,
               backoff_factor: float, growth_interval: int) -> tuple[float, int]:
    """One step of the dynamic schedule: (new scale, new count of clean steps). The product
    is taken in double and rounded to float32, as torch's CPU kernel does."""
    if found_inf:
        return _float32(scale * backoff_factor), 0
    tracker += 1
    if tracker == growth_interval:
        grown = _float32(scale * growth_factor)
        return (grown if grown != float("inf") else scale), 0
    return scale, tracker


def unscale_and_check(grads: Iterable[torch.Tensor], inv_scale: float) -> bool:
    """Multiply every gradient by ``inv_scale`` in place; True if any held inf or NaN (what
    torch's fused ``_amp_foreach_non_finite_check_and_unscale_`` does, unfused)."""
    finite = []
    with torch.no_grad():
        for g in grads:
            finite.append(torch.isfinite(g).all())  # checked before the multiply
            g.mul_(inv_scale)
    return not all_true(finite)


def any_nonfinite(grads: Iterable[torch.Tensor]) -> bool:
    """True if any gradient holds an inf or NaN: the check alone, dividing nothing."""
    return not all_true([torch.isfinite(g).all() for g in grads])


def all_true(flags: list[torch.Tensor]) -> bool:
    """Whether every 0-dim bool flag is True, read with one host read per device: on a GPU
    each read waits for the device, so one per gradient would stall every step."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for f in flags:
        by_device.setdefault(f.device, []).append(f)
    return all(bool(torch.stack(fs).all()) for fs in by_device.values())


def gradients_to_unscale(optimizer: torch.optim.Optimizer,
                         divide: bool = True) -> list[torch.Tensor]:
    """The gradients ``unscale_`` divides (or, ``divide=False``, only checks): a
    ``MasterWeightOptimizer``'s float32 master gradients (copied from the 16-bit ones
    first), or every ``param.grad`` of a plain optimizer, which must not be float16 when
    divided (torch's rule: dividing float16 gradients by S in float16 would underflow the
    very values scaling saved)."""
    master = getattr(optimizer, "master_grads", None)
    if master is not None:
        return master()
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    if divide and any(g.dtype == torch.float16 for g in grads):
        raise ValueError("Attempting to unscale FP16 gradients. Keep float32 master weights "
                         "(md.parallel.amp.MasterWeightOptimizer or MixedPrecision), or use "
                         "torch.autocast with a float32 model")
    return grads


def _check_schedule(init_scale, growth_factor, backoff_factor, growth_interval) -> None:
    for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                        ("backoff_factor", backoff_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {value!r}")
    positive_number(init_scale, "init_scale", finite=True)
    if not growth_factor > 1.0:
        raise ValueError(f"growth_factor must be > 1.0 (the scale grows), got {growth_factor!r}")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"backoff_factor must be in (0, 1) (the scale shrinks after an "
                         f"overflow), got {backoff_factor!r}")
    positive_int(growth_interval, "growth_interval (steps)")


def _check_optimizer(optimizer) -> None:
    if not hasattr(optimizer, "param_groups"):
        raise TypeError("expected a torch.optim.Optimizer (with param_groups), got "
                        f"{type(optimizer).__name__}")


def _as_scale(new_scale) -> float:
    if isinstance(new_scale, torch.Tensor):
        if new_scale.numel() != 1 or new_scale.requires_grad:
            raise ValueError("new_scale should be a float or a 1-element tensor with "
                             "requires_grad=False")
        new_scale = float(new_scale)
    if not isinstance(new_scale, float) or not 0 < new_scale < float("inf"):
        raise ValueError(f"new_scale must be a positive finite float, got {new_scale!r}")
    return new_scale


def _float32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float64).float())
