"""Tensor parallelism as in Megatron-LM (Shoeybi et al. 2019): each layer's matrices split
over the ranks of one communicator.

``mappings.py`` (Megatron's name): the f / g operators and the split / gather along the
last dimension, as autograd functions with their costs. ``layers.py``:
``ColumnParallelLinear``, ``RowParallelLinear``, ``VocabParallelEmbedding`` (each
``from_full`` and gathered back with ``full_weight``). ``cross_entropy.py``: the loss over
vocabulary-split logits. ``parallel_gpt.py``: ``parallelize_gpt`` for ``md.models.GPT``.
``naive_mlp.py``: the gather-every-output MLP beside Megatron's. ``sequence.py``: sequence
parallelism (Korthikanti et al. 2022). Bytes, time and memory per step as code:
``md.costmodel``'s ``tp.py``.
"""

from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .mappings import (
    copy_to_parallel,
    gather_from_parallel,
    gather_sequence,
    reduce_from_parallel,
    reduce_scatter_sequence,
    split_to_parallel,
)
from .naive_mlp import gather_output_mlp
from .parallel_gpt import TensorParallelGPT, parallelize_gpt, qkv_rows
from .sequence import GatheringLayerNorm, SequenceSlicedEmbedding, sum_partial_gradients

__all__ = ["ColumnParallelLinear", "GatheringLayerNorm", "RowParallelLinear",
           "SequenceSlicedEmbedding", "TensorParallelGPT", "VocabParallelEmbedding",
           "copy_to_parallel", "gather_from_parallel", "gather_output_mlp",
           "gather_sequence", "parallelize_gpt", "qkv_rows", "reduce_from_parallel",
           "reduce_scatter_sequence", "split_to_parallel", "sum_partial_gradients",
           "vocab_parallel_cross_entropy"]
