"""Collectives built from point-to-point messages: see ``api.py`` for the public functions,
``allreduce.py`` and ``rooted.py`` for the algorithms, ``ops.py`` for reduction rules;
``hierarchical.py`` and ``topology.py`` for clusters of nodes. Their costs (bytes, time, on
one link class or two) are ``md.costmodel``'s (``costmodel/collectives.py``,
``costmodel/cluster.py``); ``cluster_table`` and ``compare_all_reduce`` stay here too, as
``md.collectives.cluster_table()`` is what the README shows."""

# costmodel imports only this package's leaves (tags, topology, shared_memory), so it loads
# whole here; minidist/__init__ imports this package before it (through compression).
from ..costmodel.cluster import cluster_table, compare_all_reduce
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
from .topology import Topology, topology_of

__all__ = ["ALL_REDUCE_ALGORITHMS", "OPS", "CollectiveMismatchError", "all_gather",
           "all_reduce", "all_reduce_coalesced", "all_to_all", "broadcast", "gather", "reduce",
           "reduce_scatter", "scatter", "Topology", "topology_of", "compare_all_reduce",
           "cluster_table"]
