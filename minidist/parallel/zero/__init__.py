"""ZeRO: sharding the model state across data-parallel ranks (Rajbhandari et al., SC 2020).

``ZeRO`` (``zero_optimizer.py``) is the public wrapper, stages 0-3; ``flat_shards.py`` lays
a group of parameters out as one padded flat buffer and cuts it into one shard per rank;
``grad_buckets.py`` reduce-scatters gradients into shards during backward (stages 2, 3);
``param_units.py`` gathers and frees parameters unit by unit (stage 3, FSDP's idea), and
with ``prefetch=True`` gathers the next unit on a thread while the current one computes;
``zero_naive.py`` is stage 1 written plainly, whole tensors per rank, beside the flat one;
``zero_costs.py`` has the memory and communication formulas as code.
"""

from .flat_shards import FlatShards
from .zero_costs import zero_rank_bytes, zero_step_bytes, zero_step_time
from .zero_naive import ShardedOptimizerNaive
from .zero_optimizer import ZeRO

__all__ = ["FlatShards", "ShardedOptimizerNaive", "ZeRO", "zero_rank_bytes", "zero_step_bytes",
           "zero_step_time"]
