"""What a tensor-parallel GPT step costs, as code: bytes each rank sends, time, memory.

Per training step with b sequences of s tokens, hidden size h, vocabulary V, L blocks, p
ranks, ring all-reduces (2 (p-1)/p n elements sent per rank, ``collectives.costs``):

* each block: 4 all-reduces of b s h (attention and MLP, g forward and f backward);
* token embedding: 1 all-reduce of b s h forward (the masked lookups summed);
* head: 1 all-reduce of b s h backward (f before the vocabulary-parallel linear);
* cross-entropy: 3 all-reduces of b s (max, sum of exp, target logit).

    bytes/rank = [(4 L + 2) 2 (p-1)/p b s h + 3 x 2 (p-1)/p b s] element_size

Time (alpha-beta): (4 L + 5) 2 (p-1) alpha + bytes / beta, every all-reduce on the critical
path (nothing overlaps it: the next layer needs its result): :func:`step_comm_time`.

Memory: every matrix of the blocks, the token embedding and the head is 1/p per rank; the
LayerNorms, the position embedding and the row-parallel biases are whole on every rank.
"""

from __future__ import annotations

from ...collectives import costs as collective_costs


def all_reduces_per_step(n_layer: int) -> dict[str, int]:
    """How many all-reduces of each size one training step makes (b s h and b s elements)."""
    return {"bsh": 4 * n_layer + 2, "bs": 3}


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
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    n, bsh, bs = all_reduces_per_step(config.n_layer), batch * seq * config.n_embd, batch * seq
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
    return sum(collective_costs.bytes_sent("ring" if name == "all_reduce" else name, n,
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
        total += collective_costs.time(path, n * element_size, p, alpha, beta)
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
