"""All_reduce on a cluster of nodes: each path's time when the hops that cross nodes pay the
inter-node link, and a comparison on clusters described with real link figures.

A path is a list of rounds; in a round some pairs of ranks exchange messages of m bytes at
once, each rank on its own ports (one NIC per GPU, as on a DGX, and as the emulated network
models it), so the round takes as long as its slowest hop: max over its pairs of
alpha + m / B, with (alpha, B) the intra-node link for a pair on one node and the inter-node
link otherwise. Summed over the rounds (Hockney's alpha-beta model, as in ``costs.py``):

* ring: 2(p-1) rounds of n/p; if any hop crosses nodes every round pays the inter link:
  2(p-1) (alpha_inter + n/p / B_inter). ``topology_ring`` is the same when the ranks of a
  node are already neighbours; over ranks placed round-robin, rank order crosses at every
  hop and node order at only N, which changes the bytes on the slow link, not the time of a
  round (the slowest hop still sets it);
* tree (binomial): 2 ceil(lg p) rounds of n; a round pays the inter link once its partners
  are 2^d >= k apart (block placement);
* recursive doubling, halving-doubling: their rounds (and the folding rounds) likewise;
* naive: rank 0 receives and sends p-1 messages of n one after the other;
* hierarchical: ring rounds inside the node, then across it: ``costs.hierarchical_time``
  for equal nodes (the tests check the two agree), plus two rounds of n to fold bigger nodes.

``auto`` (``auto.py``) chooses with these on an emulated cluster network of two or more
nodes. ``compare_all_reduce`` and ``cluster_table`` compare flat ring, tree and hierarchical
on the named ``CLUSTERS`` (figures and sources in ``transports/network.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..transports.network import Link
from .topology import group_by_node, node_order

PATHS = ("naive", "tree", "ring", "recursive_doubling", "halving_doubling", "hierarchical",
         "topology_ring")

Round = tuple[float, list[tuple[int, int]]]  # (bytes per message, pairs (src, dst))


def _ring_rounds(n: float, order: Sequence[int]) -> Iterator[Round]:
    p = len(order)
    hops = [(order[i], order[(i + 1) % p]) for i in range(p)]
    for _ in range(2 * (p - 1)):
        yield n / p, hops


def _tree_rounds(n: float, p: int) -> Iterator[Round]:
    up = [[(v + d, v) for v in range(0, p, 2 * d) if v + d < p]
          for d in (1 << i for i in range((p - 1).bit_length()))]
    for pairs in up + [[(b, a) for a, b in pairs] for pairs in reversed(up)]:
        yield n, pairs


def _fold_pairs(p: int) -> tuple[int, list[tuple[int, int]]]:
    pp = 1 << (p.bit_length() - 1)
    return pp, [(2 * i, 2 * i + 1) for i in range(p - pp)]


def _doubling_rounds(n: float, p: int, halving: bool) -> Iterator[Round]:
    """Recursive doubling (whole n every round) or halving-doubling (n d / p' per round),
    folded onto p' = 2^floor(lg p) as ``allreduce._fold`` does."""
    pp, fold = _fold_pairs(p)
    real = [2 * v + 1 if v < p - pp else v + p - pp for v in range(pp)]
    ds = [1 << i for i in range(pp.bit_length() - 1)]
    sizes = [(d, n * d / pp) for d in reversed(ds)] + [(d, n * d / pp) for d in ds] \
        if halving else [(d, n) for d in ds]
    if fold:
        yield n, fold
    for d, m in sizes:
        yield m, [(real[v], real[v ^ d]) for v in range(pp)]
    if fold:
        yield n, [(b, a) for a, b in fold]


def _naive_rounds(n: float, p: int) -> Iterator[Round]:
    for src in range(1, p):
        yield n, [(src, 0)]
    for dst in range(1, p):
        yield n, [(0, dst)]


def _hierarchical_rounds(n: float, node_of: Sequence[int]) -> Iterator[Round]:
    members = group_by_node(node_of)
    k, nodes = min(len(m) for m in members), len(members)
    fold = [(m[i], m[i % k]) for m in members for i in range(k, len(m))]
    if fold:
        yield n, fold
    in_node = [(m[i], m[(i + 1) % k]) for m in members for i in range(k)]
    across = [(members[j][i], members[(j + 1) % nodes][i])
              for i in range(k) for j in range(nodes)]
    yield from [(n / k, in_node)] * (k - 1)  # reduce-scatter inside every node at once
    yield from [(n / k / nodes, across)] * (2 * (nodes - 1))  # every local rank's ring
    yield from [(n / k, in_node)] * (k - 1)  # all-gather inside every node
    if fold:
        yield n, [(b, a) for a, b in fold]


def rounds(name: str, n: float, node_of: Sequence[int]) -> Iterator[Round]:
    """The rounds of all_reduce path ``name`` (``PATHS``) on n bytes, ranks on ``node_of``."""
    p = len(node_of)
    if name == "ring":
        return _ring_rounds(n, range(p))
    if name == "topology_ring":
        return _ring_rounds(n, node_order(node_of))
    if name == "tree":
        return _tree_rounds(n, p)
    if name in ("recursive_doubling", "halving_doubling"):
        return _doubling_rounds(n, p, name == "halving_doubling")
    if name == "naive":
        return _naive_rounds(n, p)
    if name == "hierarchical":
        return _hierarchical_rounds(n, node_of)
    raise ValueError(f"no two-level cost for {name!r}; known: {', '.join(PATHS)}")


def cluster_time(name: str, n: float, node_of: Sequence[int], intra: Link,
                 inter: Link) -> float:
    """Seconds for path ``name`` on n bytes: each round's slowest hop, summed (module
    docstring). ``node_of[r]``: rank r's node."""
    if n < 0:
        raise ValueError(f"size n must be >= 0 bytes, got {n!r}")
    if len(node_of) < 2:
        return 0.0
    return sum(max((intra if node_of[a] == node_of[b] else inter).time(m) for a, b in pairs)
               for m, pairs in rounds(name, n, node_of) if pairs)


def cross_node_bytes(name: str, n: float, node_of: Sequence[int]) -> float:
    """Bytes that cross nodes in all, summed over every rank (what the slow links carry)."""
    return sum(m * sum(node_of[a] != node_of[b] for a, b in pairs)
               for m, pairs in rounds(name, n, node_of))


def block_layout(nodes: int, per_node: int) -> list[int]:
    """Rank r on node r // per_node (torchrun's numbering)."""
    for what, v in (("nodes", nodes), ("per_node", per_node)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive int, got {v!r}")
    return [r // per_node for r in range(nodes * per_node)]


def compare_all_reduce(n_bytes: float, nodes: int, per_node: int, intra: Link, inter: Link,
                       paths: Sequence[str] = ("ring", "tree", "halving_doubling",
                                               "hierarchical")) -> dict[str, float]:
    """Predicted seconds of each all_reduce path for ``n_bytes`` on ``nodes`` nodes of
    ``per_node`` ranks (block placement) joined by ``intra`` and ``inter`` links."""
    for what, link in (("intra", intra), ("inter", inter)):
        if not isinstance(link, Link):
            raise TypeError(f"{what} must be an md.Link, got {type(link).__name__}")
    layout = block_layout(nodes, per_node)
    return {name: cluster_time(name, n_bytes, layout, intra, inter) for name in paths}


CLUSTERS = {  # name -> (nodes, per_node, intra, inter): figures in transports/network.py
    "8x H100, NVLink 4 + IB NDR": (8, 8, Link.nvlink4(), Link.infiniband_ndr()),
    "8x A100, NVLink 3 + IB HDR": (8, 8, Link(3e-6, 300e9, "NVLink 3 (A100)"),  # 600 GB/s
                                   Link.infiniband_hdr()),  # both ways: A100 datasheet
    "4x 8 GPUs, PCIe 4 + 100 GbE": (4, 8, Link.pcie4_x16(), Link.ethernet_100g()),
    "4x 4 GPUs, PCIe 4 + 25 GbE": (4, 4, Link.pcie4_x16(), Link.ethernet_25g()),
}


def cluster_table(n_bytes: float = 1 << 30, clusters: dict | None = None) -> list[dict]:
    """One row per cluster: predicted seconds of ring, tree, halving-doubling and
    hierarchical for ``n_bytes`` (default 1 GiB, a 500M-parameter model's fp16 gradients),
    and hierarchical's speed-up over the ring."""
    rows = []
    for name, (nodes, k, intra, inter) in (clusters or CLUSTERS).items():
        t = compare_all_reduce(n_bytes, nodes, k, intra, inter)
        rows.append({"cluster": name, "ranks": nodes * k, **t,
                     "best": min(t, key=t.get), "ring / hierarchical": t["ring"] /
                     t["hierarchical"]})
    return rows
