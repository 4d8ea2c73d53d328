"""Argument checks shared by the library: each rule and each message written once.

Bad input gets an error that names the argument and what it was given (``"microbatches must
be a positive integer, got 0"``). The checks return the value (as an ``int`` or ``float``
where they check a number), so a caller can write ``n = positive_int(n, "n")``.

``bool`` is an ``int`` in Python; no check here takes ``True`` for a count or a size.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import torch


def _integer_phrase(low: int | None) -> str:
    if low is None:
        return "an integer"
    return {0: "a non-negative integer", 1: "a positive integer"}.get(low,
                                                                      f"an integer >= {low}")


def integer(value, what: str, low: int | None = 1, error: type[Exception] = ValueError) -> int:
    """``value`` as an int if it is a whole number >= ``low`` (any whole number for None);
    else ``error`` for a value that is not an integer (ValueError by default; TypeError
    where the caller's contract says so) and ValueError for one below ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{what} must be {_integer_phrase(low)}, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{what} must be {_integer_phrase(low)}, got {value!r}")
    return int(value)


def positive_int(value, what: str, error: type[Exception] = ValueError) -> int:
    """``value`` as an int if it is a whole number >= 1 (see :func:`integer`)."""
    return integer(value, what, 1, error)


def rank(value, world_size: int, what: str) -> int:
    """``value`` as an int if it names a rank of a communicator of ``world_size``; a
    TypeError for a value that is not an integer, a ValueError naming the valid range."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an integer rank, got {type(value).__name__}")
    if not 0 <= int(value) < world_size:
        raise ValueError(f"{what}={value} is outside the communicator: world_size is "
                         f"{world_size}, so valid ranks are 0..{world_size - 1}")
    return int(value)


def positive_number(value, what: str, *, unit: str = "", finite: bool = False,
                    error: type[Exception] = ValueError) -> float:
    """``value`` if it is a real number > 0 (and not infinite, with ``finite``); ``unit``
    names what it counts ("seconds", "MiB") in the message. Not a number: ``error``."""
    kind = "a positive finite number" if finite else "a positive number"
    message = f"{what} must be {kind}{' of ' + unit if unit else ''}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(message)
    if not value > 0 or (finite and not math.isfinite(value)):
        raise ValueError(message)
    return value


def one_of(value, choices: Iterable, what: str, why: str = "") -> object:
    """``value`` if it is one of ``choices`` (a bool is not taken for 0 or 1); else a
    ValueError listing them (``why``, if given, follows the list in parentheses)."""
    choices = tuple(choices)
    if isinstance(value, bool) and not any(isinstance(c, bool) for c in choices) or \
            value not in choices:
        listed = ", ".join(map(repr, choices)) + (f" ({why})" if why else "")
        raise ValueError(f"{what} must be one of {listed}, got {value!r}")
    return value


ZERO_STAGES = (0, 1, 2, 3)


def zero_stage(stage, what: str = "stage", optional: bool = False) -> int | None:
    """One of ZeRO's stages, 0 to 3 (or None, with ``optional``: no ZeRO at all)."""
    return one_of(stage, ((None,) if optional else ()) + ZERO_STAGES, what)


def zero_with_pipeline(stage: int, pp: int, what: str = "zero_stage") -> None:
    """ZeRO 2 and 3 reduce-scatter gradients as backward produces them (and 3 gathers each
    unit's parameters), so under a pipeline of m micro-batches they would do it m times a
    step; DeepSpeed allows only ZeRO-1 with pipeline parallelism (its ``PipelineEngine``
    asserts ``zero_optimization_stage() < 2``). The one home of that rule, for the runtime
    (``HybridGPT``) and the cost model (``Plan``)."""
    if stage >= 2 and pp > 1:
        raise ValueError(f"{what}={stage} with pp={pp}: ZeRO 2 and 3 reduce-scatter the "
                         "gradients (and 3 gathers the parameters) in every micro-batch's "
                         "backward, m times a step under a pipeline; use zero_stage=1 "
                         "(DeepSpeed allows only ZeRO-1 with pipeline parallelism)")


def tensor(value, what: str) -> torch.Tensor:
    """``value`` if it is a ``torch.Tensor``; else a TypeError naming its type."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a tensor, got {type(value).__name__}")
    return value


def token_ids(ids: torch.Tensor, vocab: int, what: str) -> None:
    """Every id in ``ids`` lies in [0, vocab); else a ValueError with the range found.

    One host sync per call: ``aminmax`` finds both bounds in one pass and one ``tolist``
    brings them over (a ``min()`` and a ``max()`` read separately were two syncs, two stalls
    of a GPU's stream). The check stays on outside debug runs: an id outside every rank's
    shard is not an error to a vocabulary-parallel lookup, it silently becomes zeros."""
    if ids.numel():
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{what} must lie in [0, {vocab}), got [{lo}, {hi}]")


def int_list(text: str, what: str) -> list[int]:
    """A command-line list such as ``"1,2,4"`` as positive ints; a ValueError naming
    ``what`` (the option) otherwise."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{what} takes positive integers separated by commas, got "
                         f"{text!r}") from None
    return [positive_int(v, what) for v in values]
