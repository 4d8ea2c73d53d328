"""Float32 master weights for a float16/bfloat16 model (Micikevicius et al., ICLR 2018).

The recipe, section 3.1 of "Mixed Precision Training": keep the model, its activations and
its gradients in 16 bits, and a float32 copy of the weights (the *master* weights) in the
optimizer. Each step: copy the 16-bit gradients into float32, unscale them there (loss
scaling, ``grad_scaler.py``), run the optimizer on the master weights in float32, and round
the result back into the 16-bit model. Why not update the 16-bit weights directly: float16
has 10 mantissa bits, so an update smaller than 2^-11 of a weight (lr x gradient is often
1e-4 of it or less) rounds away and the weight never moves; float32 keeps it.

The same structure is Apex's O2 ("FP16_Optimizer": fp16 model, fp32 master params), and
DeepSpeed's fp16/bf16 optimizer (flattened fp32 master groups, which ZeRO shards). torch's
own autocast (Apex O1) is the other way round: float32 parameters, 16-bit matmuls chosen op
by op; it needs no master copy but keeps 4-byte gradients.

Bytes per parameter with Adam (K = 8 bytes of state) at rest, i.e. after a step:

    float32 training:         4 (param) + 4 (grad) + K       = 16
    16-bit + master weights:  2 (param) + 2 (grad) + 4 (master) + K = 16

(``precision_stats.training_bytes``). The parameters, gradients and optimizer state do
*not* shrink; the master gradients (4 more bytes) exist only during the step and are freed
after it. What mixed precision saves is the activations (half the bytes, and they dominate
at scale) and, with ZeRO, the master weights and state are sharded over the ranks
(ZeRO's 2 + 2 + K/Nd bytes, with K = 12 counting the master copy).

Composition. ``MasterWeightOptimizer`` is a ``torch.optim.Optimizer`` over any list of 16-bit
parameters, so it goes wherever an optimizer class goes: after ``md.DistributedDataParallel``
(which then all-reduces 16-bit buckets: half the bytes), and as ``md.ZeRO``'s
``optimizer_class`` (each rank then keeps float32 masters of its own shard only: sharded
master weights; pass ``scaler=GradScaler(comm=comm)`` so the ranks agree on skipping).
"""

from __future__ import annotations

import torch
from torch import nn

from .grad_scaler import GradScaler
from .precision_stats import storage_bytes

HALF_DTYPES = (torch.float16, torch.bfloat16)


class MasterWeightOptimizer(torch.optim.Optimizer):
    """``base_optimizer`` run on float32 copies of 16-bit parameters.

    ``opt = MasterWeightOptimizer(model16.parameters(), torch.optim.AdamW, lr=1e-3)``. Use it
    like torch's optimizers with a ``GradScaler``: ``scaler.scale(loss).backward();
    scaler.step(opt); scaler.update()`` (the scaler unscales the float32 master gradients).
    With ``scaler=`` given here, ``opt.step()`` does all three itself, for callers that only
    call ``step()`` (``md.ZeRO``). ``param_groups`` and ``state`` are the base optimizer's
    (over the master parameters), so learning-rate schedulers work unchanged.

    ``master_grads()``: copy the 16-bit gradients into float32 (once per step).
    ``apply_master_update()``: the float32 step, then round the masters into the model.
    ``skip_master_update()``: what a skipped step does instead (the scaler calls it)."""

    def __init__(self, params, base_optimizer: type = torch.optim.AdamW, *,
                 scaler: GradScaler | None = None, **optimizer_kwargs):
        _check_base(base_optimizer, scaler)
        groups = _param_groups(params)
        self.model_params: list[torch.Tensor] = [p for g in groups for p in g["params"]]
        self.master_params: list[nn.Parameter] = [
            nn.Parameter(p.detach().to(torch.float32).clone()) for p in self.model_params]
        masters = iter(self.master_params)
        inner = [{**g, "params": [next(masters) for _ in g["params"]]} for g in groups]
        self.optimizer = base_optimizer(inner, **optimizer_kwargs)
        self.scaler = scaler
        super().__init__(self.master_params, self.optimizer.defaults)
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state
        self._copied = False

    @torch.no_grad()
    def master_grads(self) -> list[torch.Tensor]:
        """The 16-bit gradients copied into float32 master gradients (the copy is exact:
        every float16/bfloat16 value is a float32 value). Parameters without a gradient get
        none. Returns the master gradients; a second call in one step copies nothing."""
        if not self._copied:
            for p, m in zip(self.model_params, self.master_params):
                if p.grad is None:
                    m.grad = None
                elif m.grad is None:
                    m.grad = p.grad.to(torch.float32)
                else:
                    m.grad.copy_(p.grad)
            self._copied = True
        return [m.grad for m in self.master_params if m.grad is not None]

    @torch.no_grad()
    def apply_master_update(self, closure=None):
        """The float32 update, then each master rounded into its 16-bit parameter (one
        rounding per step, not one per operation). Frees the master gradients."""
        self.master_grads()
        out = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        for p, m in zip(self.model_params, self.master_params):
            p.copy_(m)
            m.grad = None
        self._copied = False
        return out

    def skip_master_update(self) -> None:
        """A skipped step: free the master gradients, so that the next step copies fresh
        ones even if the caller clears only the 16-bit gradients (``md.ZeRO.zero_grad``)
        and not this optimizer's; a stale inf/NaN would otherwise skip every later step."""
        for m in self.master_params:
            m.grad = None
        self._copied = False

    def step(self, closure=None):
        """Without a scaler: copy, update, round back. With one: ``scaler.step(self);
        scaler.update()`` (unscale in float32, skip on inf/NaN, move the scale)."""
        if self.scaler is None:
            return self.apply_master_update(closure)
        if closure is not None:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        out = self.scaler.step(self)
        self.scaler.update()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the 16-bit gradients and any master gradients left by a skipped step."""
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for m in self.master_params:
            m.grad = None
        self._copied = False

    def state_dict(self) -> dict:
        """The base optimizer's state dict plus ``master_params`` (the float32 weights: the
        16-bit model alone cannot restore them)."""
        out = self.optimizer.state_dict()
        out["master_params"] = [m.detach().clone() for m in self.master_params]
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop("master_params", None)
        if masters is None or len(masters) != len(self.master_params):
            raise ValueError("state_dict has no master_params for these parameters (expected "
                             f"{len(self.master_params)}); save it with "
                             "MasterWeightOptimizer.state_dict()")
        self.optimizer.load_state_dict(state_dict)
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state
        with torch.no_grad():
            for p, m, saved in zip(self.model_params, self.master_params, masters):
                m.copy_(saved)
                p.copy_(saved)

    def memory(self) -> dict[str, int]:
        """Bytes held now: ``params`` (16-bit model), ``grads`` (16-bit and any float32
        master gradients), ``master`` (float32 weights), ``optimizer`` (base state), total."""
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        grads = [p.grad for p in self.model_params] + [m.grad for m in self.master_params]
        out = {"params": storage_bytes(self.model_params), "grads": storage_bytes(grads),
               "master": storage_bytes(self.master_params), "optimizer": storage_bytes(state)}
        out["total"] = sum(out.values())
        return out

    def __repr__(self) -> str:
        return (f"MasterWeightOptimizer({type(self.optimizer).__name__}, "
                f"{len(self.master_params)} params, scaler={self.scaler!r})")


class MixedPrecision:
    """A model trained in ``dtype`` with float32 master weights: the whole recipe in one object.

    ``mp = MixedPrecision(model, torch.optim.AdamW, dtype=torch.float16, lr=1e-3)`` casts
    ``model`` to ``dtype`` in place, keeps float32 masters in ``mp.optimizer`` and, for
    float16, a ``GradScaler`` in ``mp.scaler`` (``scaler="auto"``; pass your own, e.g.
    ``GradScaler(comm=comm)``, or None for no loss scaling). Then per step::

        loss = lm_loss(ddp(x).float(), y)        # loss in float32, model in 16 bits
        mp.backward(loss)                          # scaler.scale(loss).backward()
        stepped = mp.step()                        # False when the step was skipped
        mp.zero_grad()

    Wrap ``mp.model`` in ``md.DistributedDataParallel`` *after* building ``mp`` (its buckets
    then hold 16-bit gradients). ``dtype=torch.float32`` gives plain float32 training through
    the same calls (the baseline). bfloat16 has float32's range: no scaler by default; but a
    NaN on one rank still needs every rank to skip, so with DDP, ZeRO or pipeline stages
    pass ``scaler=md.GradScaler(comm, loss_scaling=False)`` (the check and the agreement,
    no scaling)."""

    def __init__(self, model: nn.Module, optimizer_class: type = torch.optim.AdamW,
                 dtype: torch.dtype = torch.float16, scaler: GradScaler | str | None = "auto",
                 **optimizer_kwargs):
        _check_wrapper(model, dtype, scaler)
        self.model, self.dtype = model.to(dtype), dtype
        if scaler == "auto":
            scaler = GradScaler() if dtype == torch.float16 else None
        self.scaler: GradScaler | None = scaler
        params = [p for p in model.parameters() if p.requires_grad]
        if dtype == torch.float32:
            _check_base(optimizer_class, None)
            self.optimizer = optimizer_class(params, **optimizer_kwargs)
        else:
            self.optimizer = MasterWeightOptimizer(params, optimizer_class, **optimizer_kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss * S`` backward (just ``loss.backward()`` without a scaler)."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> bool:
        """Unscale, skip on overflow (agreed over the scaler's comm), update the scale.
        Returns True if the optimizer stepped."""
        if self.scaler is None:
            self.optimizer.step()
            return True
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return not self.scaler.found_inf

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def memory(self) -> dict[str, int]:
        """Bytes of parameters, gradients, master weights and optimizer state held now."""
        if isinstance(self.optimizer, MasterWeightOptimizer):
            return self.optimizer.memory()
        params = list(self.model.parameters())
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        out = {"params": storage_bytes(params), "grads": storage_bytes(p.grad for p in params),
               "master": 0, "optimizer": storage_bytes(state)}
        out["total"] = sum(out.values())
        return out

    def __repr__(self) -> str:
        return (f"MixedPrecision({type(self.model).__name__}, dtype={self.dtype}, "
                f"optimizer={self.optimizer!r})")


def _param_groups(params) -> list[dict]:
    params = list(params)
    if not params:
        raise ValueError("MasterWeightOptimizer got an empty parameter list")
    groups = [dict(g) for g in params] if isinstance(params[0], dict) else [{"params": params}]
    for g in groups:  # copies: the caller's dicts stay as they were
        g["params"] = list(g["params"])
        for p in g["params"]:
            if not isinstance(p, torch.Tensor) or not p.is_floating_point():
                raise TypeError("MasterWeightOptimizer needs floating-point tensors, got "
                                f"{type(p).__name__}")
    return groups


def _check_base(base_optimizer, scaler) -> None:
    if not (isinstance(base_optimizer, type) and issubclass(base_optimizer, torch.optim.Optimizer)):
        raise TypeError("the optimizer must be a torch.optim.Optimizer subclass (the class, "
                        f"e.g. torch.optim.AdamW, not an instance), got {base_optimizer!r}")
    if issubclass(base_optimizer, MasterWeightOptimizer):
        raise TypeError("base_optimizer cannot itself be a MasterWeightOptimizer")
    if scaler is not None and not isinstance(scaler, GradScaler):
        raise TypeError(f"scaler must be a md.GradScaler or None, got {type(scaler).__name__}")


def _check_wrapper(model, dtype, scaler) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if dtype not in (*HALF_DTYPES, torch.float32):
        raise ValueError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, "
                         f"got {dtype!r}")
    if scaler != "auto" and scaler is not None and not isinstance(scaler, GradScaler):
        raise TypeError(f"scaler must be a md.GradScaler, 'auto' or None, got {scaler!r}")
