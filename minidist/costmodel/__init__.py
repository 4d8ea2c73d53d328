"""The cost model: time and memory of a training plan, as formulas in code, for clusters far
larger than this machine. The lessons, ``auto`` and the tests use these same functions.

* ``transformer_params``: Megatron-LM's parameter count (Narayanan et al., SC 2021).
* ``zero_memory``: model-state bytes per rank under ZeRO stages 0-3 (Rajbhandari et al.,
  SC 2020).
* ``bubble_fraction``, ``bubble_overhead``: a pipeline's bubble (GPipe, Huang et al. 2019;
  interleaved 1F1B, Narayanan et al. SC 2021).

The collectives' own costs (bytes per rank, alpha-beta time) are in
``minidist.collectives.costs``.
"""

from .formulas import (
    ZERO_STAGES,
    bubble_fraction,
    bubble_overhead,
    transformer_params,
    zero_memory,
)

__all__ = ["ZERO_STAGES", "bubble_fraction", "bubble_overhead", "transformer_params",
           "zero_memory"]
