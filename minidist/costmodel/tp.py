"""Tensor parallelism's costs, as code: the bytes each rank sends, the time, the memory.

Notation: b sequences of s tokens per micro-batch, hidden h, vocabulary V, l layers (blocks),
t = p tensor-parallel ranks, e bytes per value; a ring all-reduce of n bytes sends
2 (t-1)/t n per rank and takes ring(n, t) = 2 (t-1) alpha + 2 (t-1)/t n / beta
(``collectives.py``).

The all-reduces of one micro-batch, counted (``all_reduces``; ``tests/costmodel/test_tp.py``
counts them with ``comm.stats`` in runs of ``parallelize_gpt`` and ``HybridGPT``):

* each layer: 4 of b s h. Megatron-LM (Shoeybi et al. 2019, section 3) puts g (all-reduce
  forward) after the row-parallel linear of the attention and of the MLP, and f (all-reduce
  backward) before the column-parallel linear of each: 2 forward, 2 backward. This is
  Narayanan et al.'s count ("Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC 2021, section 3.3): tensors of b s h all-reduced twice in the
  forward and twice in the backward pass per layer, 8 b s h (t-1)/t per layer per device per
  micro-batch. Full recomputation replays the forward: 6.
* the vocabulary-parallel embedding: each rank looks up the tokens of its V/t rows (zeros
  for the others) and one all-reduce of b s h sums them, forward (g);
* the head: a column-parallel linear behind f, one all-reduce of b s h backward;
* the vocabulary-parallel cross-entropy: 3 of b s (the max, the sum of exp, the target's
  logit; ``cross_entropy_bytes``), forward. 1/h of the bytes of the others, but each pays
  2 (t-1) alpha.

So one stage holding the whole model makes (4 l + 2) all-reduces of b s h and 3 of b s per
micro-batch: the "+2" is the embedding's forward and the head's backward all-reduce; the
loss's three are of b s. Under a pipeline the embedding sits on the first stage and the head
and loss on the last: with l/pp layers a stage, the first makes 4 l/pp + 1 of b s h, the
middle ones 4 l/pp, the last 4 l/pp + 1 and the 3 of b s. In 1F1B's steady state each stage
runs one forward and one backward per slot and the slowest stage sets the pace, so a step's
critical path holds the last stage's count m times (``tp_time``):

    t_tp = m [(c l/pp + 1 + [pp = 1]) ring(e b s h, t) + 3 ring(e b s, t)]

with c = 4 (6 with full recomputation). Sequence parallelism replaces each all-reduce of
b s h by an all-gather and a reduce-scatter, whose ring times add up to the all-reduce's.
This replaced two disagreeing terms: ``parallel/hybrid_costs.py``'s 4 (l/pp) m (Narayanan's
count, the transformer layers only) left out the embedding, the head and the loss, and the
cost model's (4 l/pp + 2) m charged the embedding's and the head's all-reduces to every
stage and left out the loss.

Per training step of ``parallelize_gpt(GPT(config))`` (``step_collectives``, exact per rank
when p divides the sequence and the hidden size):

    bytes/rank = [(4 l + 2) 2 (p-1)/p b s h + 3 x 2 (p-1)/p b s] element_size

Time (alpha-beta): (4 l + 5) 2 (p-1) alpha + bytes / beta, every all-reduce on the critical
path (nothing overlaps it: the next layer needs its result): ``step_comm_time``. The
operators one at a time: ``op_cost``; the naive MLP beside Megatron's:
``naive_mlp_bytes``, ``megatron_mlp_bytes``.

Memory: every matrix of the blocks, the token embedding and the head is 1/p per rank; the
LayerNorms, the position embedding and the row-parallel biases are whole on every rank
(``param_counts``).
"""

from __future__ import annotations

from ..checks import one_of
from . import collectives
from .cluster import PRECISION_BYTES, Cluster
from .plan import Plan
from .transformer import GPTShape


def all_reduces(layers: int, embedding: bool = True, head: bool = True,
                recompute: str = "none") -> dict[str, int]:
    """All-reduces one micro-batch makes on a tensor-parallel stage of ``layers`` blocks that
    holds the vocabulary-parallel ``embedding`` and/or the ``head`` and loss: {"bsh": of
    b s h elements, "bs": of b s} (module docstring)."""
    per_layer = 6 if recompute == "full" else 4
    return {"bsh": per_layer * layers + int(embedding) + int(head), "bs": 3 * int(head)}


def _ring(nbytes: float, p: int, link) -> float:
    return 0.0 if p == 1 else collectives.ring_time(nbytes, p, link.alpha, link.bandwidth)


def tp_time(model: GPTShape, cluster: Cluster, plan: Plan) -> float:
    """Seconds of tensor-parallel all-reduces on a step's critical path: the last pipeline
    stage's, m times (module docstring)."""
    e, b, t = PRECISION_BYTES[plan.precision], plan.micro_batch_size, plan.tp
    link = cluster.link(t, 1)
    n = all_reduces(model.layers // plan.pp, embedding=plan.pp == 1, recompute=plan.recompute)
    tokens = e * b * model.seq
    per_microbatch = n["bsh"] * _ring(tokens * model.hidden, t, link) + \
        n["bs"] * _ring(tokens, t, link)
    return plan.microbatches * per_microbatch


LAYOUTS = ("megatron", "naive_mlp", "sequence_parallel")


def step_collectives(config, batch: int, seq: int, p: int, layout: str = "megatron"
                     ) -> list[tuple[str, int]]:
    """Every collective of one training step as (name, elements): ``("all_reduce", n)`` and
    ``("reduce_scatter", n)`` of the whole tensor, ``("all_gather", n)`` of one rank's piece.

    ``"naive_mlp"``: each MLP all-gathers its 4h and h outputs and all-reduces its h and 4h
    input gradients instead of Megatron's 2 all-reduces of h (``naive_mlp.py``).
    ``"sequence_parallel"``: every all-reduce of b s h becomes an all-gather and a
    reduce-scatter (one each way), plus one all-reduce per parameter with a partial gradient
    (per block 2 LayerNorms and 2 biases, then ``ln_f`` and the position embedding)."""
    one_of(layout, LAYOUTS, "layout")
    n, bsh, bs = all_reduces(config.n_layer), batch * seq * config.n_embd, batch * seq
    h, L = config.n_embd, config.n_layer
    ce = [("all_reduce", bs)] * n["bs"]
    if layout == "sequence_parallel":
        ln = [("all_reduce", h)] * (2 if config.bias else 1)
        hooks = (2 * ln + [("all_reduce", h)] * 2 * config.bias) * L + ln + [
            ("all_reduce", config.block_size * h)]
        return [("all_gather", bsh // p), ("reduce_scatter", bsh)] * n["bsh"] + ce + hooks
    calls = [("all_reduce", bsh)] * n["bsh"] + ce
    if layout == "naive_mlp":
        calls = calls[2 * L:]  # the MLPs' own g and f, replaced by:
        calls += [("all_gather", 4 * bsh // p), ("all_gather", bsh // p),
                  ("all_reduce", bsh), ("all_reduce", 4 * bsh)] * L
    return calls


def step_bytes(config, batch: int, seq: int, element_size: int, p: int, rank: int,
               layout: str = "megatron") -> int:
    """Bytes ``rank`` sends in one training step of ``parallelize_gpt(GPT(config))`` with
    ``algorithm="ring"`` (exactly what ``comm.stats.bytes_sent`` shows when p divides the
    sequence and the hidden size)."""
    return sum(collectives.bytes_sent("ring" if name == "all_reduce" else name, n,
                                           element_size, p, rank)
               for name, n in step_collectives(config, batch, seq, p, layout))


def step_comm_time(config, batch: int, seq: int, element_size: int, p: int, alpha: float,
                   beta: float, layout: str = "megatron") -> float:
    """Seconds of communication per step on a link of latency ``alpha`` and bandwidth
    ``beta`` (bytes/s), none of it hidden behind computation (the next layer needs each
    result): the sum over ``step_collectives`` of their ring formulas, e.g. 2(p-1) alpha +
    2 (p-1)/p n / beta for an all-reduce of n bytes."""
    total = 0.0
    for name, n in step_collectives(config, batch, seq, p, layout):
        path = "ring" if name == "all_reduce" else name
        total += collectives.time(path, n * element_size, p, alpha, beta)
    return total


def param_counts(config, p: int) -> dict[str, int]:
    """Parameters held per rank: ``sharded`` (1/p each), ``replicated`` (whole on every
    rank) and ``per_rank`` = sharded / p + replicated; ``full`` is the whole model's."""
    h, v, L, bias = config.n_embd, config.vocab_size, config.n_layer, int(config.bias)
    ln = 2 * h if bias else h
    block_sharded = 3 * h * h + 3 * h * bias + h * h + 4 * h * h + 4 * h * bias + 4 * h * h
    block_replicated = 2 * ln + 2 * h * bias  # two LayerNorms, the two row-parallel biases
    head = 0 if config.tie_weights else v * h
    sharded = L * block_sharded + v * h + head
    replicated = L * block_replicated + config.block_size * h + ln
    return {"sharded": sharded, "replicated": replicated,
            "per_rank": sharded // p + replicated, "full": sharded + replicated}


OPERATORS = ("copy", "reduce", "split", "gather", "gather_sequence", "reduce_scatter_sequence")


def op_cost(name: str, nbytes: float, p: int, alpha: float, beta: float) -> dict[str, float]:
    """Seconds (forward, backward) of the tensor-parallel operator ``name``
    (``parallel/tensor/mappings.py``) on a full tensor of ``nbytes`` over p ranks, ring
    algorithm: all-reduce 2(p-1) alpha + 2 (p-1)/p n / beta; all-gather of n/p-byte pieces
    and reduce-scatter of n bytes (p-1) alpha + (p-1)/p n / beta; split 0."""
    if name not in OPERATORS:
        raise ValueError(f"op_cost: unknown operator {name!r}; choose one of {OPERATORS}")
    reduce = collectives.time("ring", nbytes, p, alpha, beta)
    gather = collectives.time("all_gather", nbytes / p, p, alpha, beta)
    scatter = collectives.time("reduce_scatter", nbytes, p, alpha, beta)
    forward, backward = {"copy": (0.0, reduce), "reduce": (reduce, 0.0),
                         "split": (0.0, gather), "gather": (gather, 0.0),
                         "gather_sequence": (gather, scatter),
                         "reduce_scatter_sequence": (scatter, gather)}[name]
    return {"forward": forward, "backward": backward}


def megatron_mlp_bytes(tokens: int, hidden: int, element_size: int, p: int, rank: int) -> int:
    """Bytes ``rank`` sends per training step in a Megatron MLP (or attention) block: one
    ring all-reduce of tokens x hidden forward (g) and one backward (f)."""
    return 2 * collectives.ring_bytes(tokens * hidden, element_size, p, rank)


def naive_mlp_bytes(tokens: int, hidden: int, element_size: int, p: int, rank: int) -> int:
    """Bytes ``rank`` sends per training step in the naive MLP (``naive_mlp.py``):
    all-gathers of the 4h and h outputs forward, ring all-reduces of the h and 4h input
    gradients backward: 15 (p-1)/p tokens hidden elements, against Megatron's 4."""
    n = tokens * hidden
    gathers = sum(collectives.all_gather_bytes(k * n // p, element_size, p, rank)
                  for k in (4, 1))
    reduces = sum(collectives.ring_bytes(k * n, element_size, p, rank) for k in (1, 4))
    return gathers + reduces


def cross_entropy_bytes(tokens: int, element_size: int, p: int, rank: int) -> int:
    """Bytes ``rank`` sends in the vocabulary-parallel cross-entropy: 3 ring all-reduces
    (max, sum of exp, target logit) of one number per token, 3 x 2 (p-1)/p tokens
    element_size."""
    return 3 * collectives.ring_bytes(tokens, element_size, p, rank)


def gathered_logits_bytes(tokens: int, vocab: int, element_size: int, p: int) -> int:
    """Bytes a rank sends to all-gather the full logits instead: (p-1) tokens V/p."""
    return collectives.all_gather_bytes(tokens * vocab // p, element_size, p, 0)
