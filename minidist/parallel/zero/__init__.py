"""ZeRO: sharding the model state across data-parallel ranks (Rajbhandari et al., SC 2020).

``ZeRO`` (``zero_optimizer.py``) is the public wrapper: ``ZeRO(module, comm, stage=k)``
returns the stage's own class, each in a file to be read on its own: ``stage0.py`` (plain
data parallelism on the flat buffer), ``stage1.py`` (optimizer state sharded:
reduce-scatter, shard update, all-gather), ``stage2.py`` (gradients too, reduce-scattered in
backward buckets), ``stage3.py`` (parameters too, gathered unit by unit). What they share:
``flat_shards.py`` lays a group of parameters out as one padded flat buffer and cuts it into
one shard per rank; ``grad_buckets.py`` reduce-scatters gradients into shards during
backward (stages 2, 3); ``param_units.py`` gathers and frees parameters unit by unit
(stage 3, FSDP's idea), and with ``prefetch=True`` gathers the next unit on a thread while
the current one computes; ``zero_naive.py`` is stage 1 written plainly, whole tensors per
rank, beside the flat one. The memory and communication formulas are the cost model's
(``costmodel/zero.py``).
"""

from .flat_shards import FlatShards
from .stage0 import ZeROStage0
from .stage1 import ZeROStage1
from .stage2 import ZeROStage2
from .stage3 import ZeROStage3
from .zero_naive import ShardedOptimizerNaive
from .zero_optimizer import ZeRO

__all__ = ["FlatShards", "ShardedOptimizerNaive", "ZeRO", "ZeROStage0", "ZeROStage1",
           "ZeROStage2", "ZeROStage3"]
