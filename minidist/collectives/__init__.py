"""Collectives built from point-to-point messages: see ``api.py`` for the public functions,
``allreduce.py`` and ``basic.py`` for the algorithms, ``ops.py`` for reduction rules;
``hierarchical.py``, ``topology.py`` and ``cluster_costs.py`` for clusters of nodes."""

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
from .cluster_costs import cluster_table, compare_all_reduce
from .ops import OPS
from .topology import Topology, topology_of

__all__ = ["ALL_REDUCE_ALGORITHMS", "OPS", "CollectiveMismatchError", "all_gather",
           "all_reduce", "all_reduce_coalesced", "all_to_all", "broadcast", "gather", "reduce",
           "reduce_scatter", "scatter", "Topology", "topology_of", "compare_all_reduce",
           "cluster_table"]
