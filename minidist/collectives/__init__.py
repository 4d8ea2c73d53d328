"""Collectives built from point-to-point messages: see ``api.py`` for the public functions,
``allreduce.py`` and ``basic.py`` for the algorithms, ``ops.py`` for reduction rules."""

from ..errors import CollectiveMismatchError
from .api import (
    ALL_REDUCE_ALGORITHMS,
    all_gather,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .ops import OPS

__all__ = ["ALL_REDUCE_ALGORITHMS", "OPS", "CollectiveMismatchError", "all_gather",
           "all_reduce", "all_reduce_coalesced", "all_to_all", "broadcast", "gather", "reduce",
           "reduce_scatter", "scatter"]
