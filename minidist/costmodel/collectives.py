"""What each collective costs, as code: the bytes every rank sends, and the time it takes.

The time model is Hockney's alpha-beta, with gamma for reductions, in the form Thakur,
Rabenseifner and Gropp use for MPICH ("Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005): a message of n bytes takes alpha + n / beta (alpha: latency in
seconds, beta: bandwidth in bytes/s) and reducing n bytes takes n gamma (seconds per byte).
Counting along the critical path,

    t = messages * alpha + bytes / beta + reduced * gamma

n is the tensor's size in bytes (of one rank's piece for all_gather, gather, scatter and
all_to_all), p the world size, lg the base-2 logarithm, p' = 2^floor(lg p) the power of two
that recursive doubling and halving-doubling fold p onto (+fold: only when p' < p).

| path | messages | bytes | reduced |
| --- | --- | --- | --- |
| naive | 2(p-1) | 2(p-1) n | (p-1) n |
| tree | 2 ceil(lg p) | 2 ceil(lg p) n | ceil(lg p) n |
| recursive_doubling | lg p' (+2) | lg p' n (+2n) | lg p' n (+n) |
| ring (Patarasuk and Yuan 2009) | 2(p-1) | 2 (p-1)/p n | (p-1)/p n |
| halving_doubling (Rabenseifner 2004) | 2 lg p' (+2) | 2 (p'-1)/p' n (+2n) | (p'-1)/p' n (+n) |
| shm (barriers, not messages) | 2 ceil(n / piece) | 2 (p-1)/p n | (p-1)/p n |
| broadcast (binomial) | ceil(lg p) | ceil(lg p) n | 0 |
| reduce (binomial) | ceil(lg p) | ceil(lg p) n | ceil(lg p) n |
| reduce_scatter (ring) | p-1 | (p-1)/p n | (p-1)/p n |
| all_gather (ring), gather, scatter (linear), all_to_all (pairwise) | p-1 | (p-1) n | 0 |

Times take n in bytes as a real number (n/p need not be whole). Bytes sent are exact: the
``*_bytes(n, element_size, p, rank)`` functions take n in elements and give what
``comm.stats.bytes_sent`` shows on that rank after the call, whatever n and p (0, primes,
lengths p does not divide, world sizes that are not powers of two), as the tests assert.
``time(name, ...)`` and ``bytes_sent(name, ...)`` dispatch by name.

Two link classes (a cluster of nodes): ``hierarchical_time``, ``hierarchical_inter_bytes``
and ``hierarchical_link_bytes`` here; every path's time with the hops that cross nodes
paying the inter-node link, and the comparison on named clusters, in ``cluster.py``.

The algorithms themselves are in ``minidist/collectives/``; ``auto`` chooses among them with
these formulas, and this module imports only the leaves of that package (``tags``,
``topology``, ``shared_memory``'s constants), never its API, so either package can be
imported first.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..checks import positive_int
from ..collectives.shared_memory import _SLOTS_AT, PIECE
from ..collectives.tags import chunk_bounds
from ..collectives.topology import group_by_node, node_order
from ..transports.shm_segment import SCRATCH_SLOT

ALL_REDUCE_PATHS = ("naive", "tree", "ring", "recursive_doubling", "halving_doubling", "shm")
COLLECTIVES = ("broadcast", "reduce", "reduce_scatter", "all_gather", "gather", "scatter",
               "all_to_all")


class Terms(NamedTuple):
    """Messages, bytes and reduced bytes on the critical path; t is linear in them."""

    messages: float
    bytes: float
    reduced: float = 0.0

    def time(self, alpha: float, beta: float, gamma: float = 0.0) -> float:
        return self.messages * alpha + self.bytes / beta + self.reduced * gamma


def _lg(p: int) -> int:
    """ceil(lg p): rounds of a binomial tree."""
    return (p - 1).bit_length()


def _fold(p: int) -> tuple[int, int]:
    """(lg p', 1 if p' < p else 0)."""
    lg = p.bit_length() - 1
    return lg, int(p != 1 << lg)


def shm_piece_bytes(p: int, scratch_bytes: int | None = None) -> int:
    """Bytes of one piece of the shared-memory path: a slot of the scratch area, as
    ``shared_memory._slots`` cuts it (the local backend sizes the area (p+1) * 4 MiB)."""
    scratch = (p + 1) * SCRATCH_SLOT if scratch_bytes is None else scratch_bytes
    return min(PIECE, (scratch - _SLOTS_AT) // (p + 1) // 64 * 64)


# --- terms on the critical path (n in bytes) -------------------------------------------

def _terms_table(name: str, n: float, p: int, piece_bytes: int | None) -> Terms:
    lg, (lgf, fold) = _lg(p), _fold(p)
    pf = 1 << lgf
    if name == "shm":
        if p == 1:
            return Terms(0, 0, 0)
        piece = shm_piece_bytes(p) if piece_bytes is None else piece_bytes
        return Terms(2 * math.ceil(n / piece), 2 * (p - 1) / p * n, (p - 1) / p * n)
    table = {
        "naive": (2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n),
        "tree": (2 * lg, 2 * lg * n, lg * n),
        "recursive_doubling": (lgf + 2 * fold, (lgf + 2 * fold) * n, (lgf + fold) * n),
        "ring": (2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n),
        "halving_doubling": (2 * lgf + 2 * fold, (2 * (pf - 1) / pf + 2 * fold) * n,
                             ((pf - 1) / pf + fold) * n),
        "broadcast": (lg, lg * n, 0),
        "reduce": (lg, lg * n, lg * n),
        "reduce_scatter": (p - 1, (p - 1) / p * n, (p - 1) / p * n),
    }
    if name in table:
        return Terms(*table[name])
    if name in ("all_gather", "gather", "scatter", "all_to_all"):
        return Terms(p - 1, (p - 1) * n, 0)
    raise ValueError(f"no cost formula for {name!r}; known: "
                     f"{', '.join(ALL_REDUCE_PATHS + COLLECTIVES)}")


def terms(name: str, n: float, p: int, piece_bytes: int | None = None) -> Terms:
    """(messages, bytes, reduced bytes) on the critical path of ``name`` (an all_reduce
    path of ``ALL_REDUCE_PATHS`` or a collective of ``COLLECTIVES``) for n bytes on p ranks.
    The fits of ``minidist bench collectives`` regress measured times on these."""
    _check(n, p)
    return _terms_table(name, n, p, piece_bytes)


def time(name: str, n: float, p: int, alpha: float, beta: float, gamma: float = 0.0,
         piece_bytes: int | None = None) -> float:
    """Seconds for ``name`` on n bytes and p ranks: messages alpha + bytes / beta +
    reduced gamma (see the table in the module docstring)."""
    return terms(name, n, p, piece_bytes).time(alpha, beta, gamma)


def _time_of(name: str, doc: str):
    """``name``'s time as a function t(n, p, alpha, beta, gamma=0.0) with its formula."""
    def t(n, p, alpha, beta, gamma=0.0, **kw):
        return time(name, n, p, alpha, beta, gamma, **kw)
    t.__name__ = t.__qualname__ = f"{name}_time"
    t.__doc__ = doc + " Seconds; n in bytes, beta in bytes/s, gamma in s per byte."
    return t


naive_time = _time_of("naive", "2(p-1) alpha + 2(p-1) n / beta + (p-1) n gamma, all of it "
                      "at rank 0.")
tree_time = _time_of("tree", "2 ceil(lg p) (alpha + n / beta) + ceil(lg p) n gamma: binomial "
                     "reduce, then broadcast.")
ring_time = _time_of("ring", "2(p-1) alpha + 2 (p-1)/p n / beta + (p-1)/p n gamma (Patarasuk "
                     "and Yuan 2009).")
recursive_doubling_time = _time_of(
    "recursive_doubling", "lg p' (alpha + n / beta + n gamma) (Thakur et al. 2005), plus "
    "2 alpha + 2 n / beta + n gamma to fold when p is not a power of two.")
halving_doubling_time = _time_of(
    "halving_doubling", "2 lg p' alpha + 2 (p'-1)/p' n / beta + (p'-1)/p' n gamma "
    "(Rabenseifner 2004; Thakur et al. 2005), plus 2 alpha + 2 n / beta + n gamma to fold.")
shm_time = _time_of("shm", "2 ceil(n / piece) alpha (two barriers per piece) + 2 (p-1)/p n "
                    "/ beta + (p-1)/p n gamma: a rank's copies move what ring sends.")
broadcast_time = _time_of("broadcast", "ceil(lg p) (alpha + n / beta): binomial tree.")
reduce_time = _time_of("reduce", "ceil(lg p) (alpha + n / beta + n gamma): binomial tree.")
reduce_scatter_time = _time_of("reduce_scatter", "(p-1) (alpha + n/p / beta + n/p gamma), "
                               "n the whole tensor: ring.")
all_gather_time = _time_of("all_gather", "(p-1) (alpha + n / beta), n one rank's tensor: ring.")
gather_time = _time_of("gather", "(p-1) (alpha + n / beta) at the root, n one piece: linear.")
scatter_time = _time_of("scatter", "(p-1) (alpha + n / beta) at the root, n one piece: linear.")
all_to_all_time = _time_of("all_to_all", "(p-1) (alpha + n / beta), n one row: pairwise "
                           "exchange.")


def _check(n, p) -> None:
    positive_int(p, "world size p")
    if n < 0:
        raise ValueError(f"size n must be >= 0, got {n!r}")



# --- bytes each rank sends (n in elements), exactly as comm.stats counts them ----------

def _children(v: int, p: int) -> int:
    """Children of node v (numbered from the root) in the binomial tree: v + 2^k for every
    2^k below v's lowest set bit (every 2^k < p for the root) that is a rank."""
    low = v & -v if v else 1 << p.bit_length()
    return sum(1 for k in range(p.bit_length()) if (1 << k) < low and v + (1 << k) < p)


def naive_bytes(n, element_size, p, rank):
    """Rank 0 sends the result to the p-1 others, (p-1) n; every other rank its tensor, n."""
    return n * element_size * ((p - 1) if rank == 0 else 1)


def tree_bytes(n, element_size, p, rank):
    """n to its parent in the reduce (every rank but 0), then n to each of its children in
    the broadcast: rank 0 sends ceil(lg p) n, all ranks together 2(p-1) n."""
    return n * element_size * (int(rank != 0) + _children(rank, p))


def ring_bytes(n, element_size, p, rank):
    """Every chunk but its own in the reduce-scatter, every chunk but its right
    neighbour's in the all-gather: 2n - c_r - c_{r+1} with chunks c of
    ``tags.chunk_bounds(n, p)``; 2 (p-1)/p n when p divides n."""
    b = chunk_bounds(n, p)
    c = [b[k + 1] - b[k] for k in range(p)]
    return (2 * n - c[rank] - c[(rank + 1) % p]) * element_size


def _folded(n, p, rank):
    """(my rank among the p' ranks or -1 if I sit out, p', bytes sent to fold and unfold)."""
    lg, _ = _fold(p)
    pf, extra = 1 << lg, p - (1 << lg)
    if rank >= 2 * extra:
        return rank - extra, pf, 0
    return (-1, pf, n) if rank % 2 == 0 else (rank // 2, pf, n)


def recursive_doubling_bytes(n, element_size, p, rank):
    """lg p' n; with folding, ranks below 2(p-p') send n more (the even ones their tensor,
    the odd ones the result back), and the even ones sit out: n in all."""
    v, pf, fold = _folded(n, p, rank)
    return (fold + (0 if v < 0 else (pf.bit_length() - 1) * n)) * element_size


def halving_doubling_bytes(n, element_size, p, rank):
    """Halving sends every chunk (of ``chunk_bounds(n, p')``) but its own once; doubling
    round k sends the 2^k chunks it owns; 2 (p'-1)/p' n when p' divides n. Folding as
    :func:`recursive_doubling_bytes`."""
    v, pf, fold = _folded(n, p, rank)
    if v < 0:
        return fold * element_size
    b = chunk_bounds(n, pf)
    halving = n - (b[v + 1] - b[v])
    doubling = sum(b[(v >> k << k) + (1 << k)] - b[v >> k << k]
                   for k in range(pf.bit_length() - 1))
    return (fold + halving + doubling) * element_size


def shm_bytes(n, element_size, p, rank, piece_bytes=None):
    """The shared-memory path, counted as if it passed messages: per piece of m elements,
    rank r copies in range k of the piece for each rank k that reduces it, and the range it
    reduced goes out to the p-1 others: m - m_r + (p-1) m_r, with m_k = m(k+1)//p - mk//p.
    2 (p-1)/p n when p divides every piece."""
    if p == 1:
        return 0
    step = (shm_piece_bytes(p) if piece_bytes is None else piece_bytes) // element_size
    total = 0
    for start in range(0, n, step):
        m = min(step, n - start)
        mine = m * (rank + 1) // p - m * rank // p
        total += m + (p - 2) * mine
    return total * element_size


def broadcast_bytes(n, element_size, p, rank, root=0):
    """n to each of its children in the binomial tree: ceil(lg p) n by the root."""
    return n * element_size * _children((rank - root) % p, p)


def reduce_bytes(n, element_size, p, rank, root=0):
    """n by every rank but the root (its subtree's partial result, once)."""
    return 0 if rank == root else n * element_size


def gather_bytes(n, element_size, p, rank, root=0):
    """n (one piece) by every rank but the root."""
    return 0 if rank == root else n * element_size


def scatter_bytes(n, element_size, p, rank, root=0):
    """(p-1) n by the root (n: one piece), nothing by the others."""
    return (p - 1) * n * element_size if rank == root else 0


def all_gather_bytes(n, element_size, p, rank):
    """(p-1) n (n: one rank's tensor): the ring passes every piece but one's right
    neighbour's."""
    return (p - 1) * n * element_size


def all_to_all_bytes(n, element_size, p, rank):
    """(p-1) n (n: one row): one row to every other rank."""
    return (p - 1) * n * element_size


def reduce_scatter_bytes(n, element_size, p, rank, row=1):
    """Every shard but its own, n - c_r, the tensor's n // row rows cut as
    ``chunk_bounds``; (p-1)/p n when p divides the rows."""
    rows = n // row if row else 0
    b = chunk_bounds(rows, p)
    return (n - (b[rank + 1] - b[rank]) * row) * element_size


# --- two link classes: hierarchical all_reduce (``hierarchical.py``) ---------------------

def hierarchical_time(n: float, nodes: int, per_node: int, intra, inter,
                      gamma: float = 0.0) -> float:
    """Seconds for hierarchical all_reduce of n bytes on ``nodes`` nodes of ``per_node``
    ranks, ``intra``/``inter`` links (anything with ``alpha`` and ``bandwidth``, e.g.
    ``md.Link``): a ring reduce-scatter + all-gather inside the node, whose terms are the
    ring all_reduce's on k ranks, plus a ring all_reduce of n/k bytes across the N nodes:

        2(k-1) alpha_intra + 2 (k-1)/k n / B_intra + (k-1)/k n gamma
      + 2(N-1) alpha_inter + 2 (N-1)/N (n/k) / B_inter + (N-1)/N (n/k) gamma
    """
    _check(n, nodes)
    _check(n, per_node)
    return (ring_time(n, per_node, intra.alpha, intra.bandwidth, gamma)
            + ring_time(n / per_node, nodes, inter.alpha, inter.bandwidth, gamma))


def hierarchical_inter_bytes(n: float, nodes: int, per_node: int) -> float:
    """Bytes each rank sends over the inter-node link in hierarchical all_reduce of n
    bytes: 2 (N-1)/N n/k (a flat ring crossing nodes sends 2 (p-1)/p n on its crossing
    hops). Exact per rank, for any length: :func:`hierarchical_link_bytes`."""
    _check(n, nodes)
    _check(n, per_node)
    return 2 * (nodes - 1) / nodes * n / per_node


def hierarchical_link_bytes(n: int, element_size: int, node_of, rank: int) -> tuple[int, int]:
    """(bytes sent inside the node, bytes sent across nodes) by ``rank`` in hierarchical
    all_reduce of n elements, ``node_of[r]`` the node of each rank. With k the smallest
    node's size: local ranks >= k send their tensor (n) to local rank i % k and nothing
    else; local rank i < k sends the ring's bytes on k ranks, n to each rank folded onto
    it, and across nodes the ring's bytes on N ranks for its chunk i of
    ``chunk_bounds(n, k)``."""
    members = group_by_node(node_of)
    j = next(j for j, m in enumerate(members) if rank in m)
    k, i = min(len(m) for m in members), members[j].index(rank)
    if i >= k:
        return n * element_size, 0
    folded = len(range(i + k, len(members[j]), k))
    b = chunk_bounds(n, k)
    intra = ring_bytes(n, element_size, k, i) + folded * n * element_size
    return intra, ring_bytes(b[i + 1] - b[i], element_size, len(members), j)


def hierarchical_bytes(n, element_size, p, rank, node_of=None):
    """Everything ``rank`` sends in hierarchical all_reduce (:func:`hierarchical_link_bytes`
    summed); ``node_of`` None: one node, where it is the ring."""
    return sum(hierarchical_link_bytes(n, element_size, node_of or [0] * p, rank))


def topology_ring_bytes(n, element_size, p, rank, node_of=None):
    """The ring's bytes at ``rank``'s place in node order (``topology.node_order``)."""
    return ring_bytes(n, element_size, p, node_order(node_of or [0] * p).index(rank))


_BYTES = {"naive": naive_bytes, "tree": tree_bytes, "ring": ring_bytes,
          "recursive_doubling": recursive_doubling_bytes,
          "halving_doubling": halving_doubling_bytes, "shm": shm_bytes,
          "broadcast": broadcast_bytes, "reduce": reduce_bytes,
          "reduce_scatter": reduce_scatter_bytes, "all_gather": all_gather_bytes,
          "gather": gather_bytes, "scatter": scatter_bytes, "all_to_all": all_to_all_bytes,
          "hierarchical": hierarchical_bytes, "topology_ring": topology_ring_bytes}


def bytes_sent(name: str, n: int, element_size: int, p: int, rank: int, **kw) -> int:
    """Bytes ``rank`` sends in ``name`` (an all_reduce path or a collective) on n elements
    of ``element_size`` bytes; ``kw``: ``root`` (broadcast, reduce, gather, scatter),
    ``row`` (reduce_scatter: elements per row), ``piece_bytes`` (shm), ``node_of``
    (hierarchical, topology_ring: the node of each rank; default one node)."""
    if name not in _BYTES:
        raise ValueError(f"no byte count for {name!r}; known: {', '.join(_BYTES)}")
    _check(n, p)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n counts elements: an integer, got {n!r}")
    if not 0 <= rank < p:
        raise ValueError(f"rank {rank} is outside a world of {p}")
    if element_size < 1:
        raise ValueError(f"element_size must be >= 1 byte, got {element_size}")
    return _BYTES[name](n, element_size, p, rank, **kw)
