"""Pure index math (numpy only): Megatron GPT document/sample/shuffle indices and blending indices.

- :mod:`shardtok.index.gpt`: Megatron-core 0.16.1 ``GPTDataset`` indices, bit for bit.
- :mod:`shardtok.index.cache`: the same, stored atomically on disk and memory-mapped.
- :mod:`shardtok.index.blending`: Megatron/Nanotron greedy blending with exact tie-breaking,
  and the Nanoset epoch order.
"""

from shardtok.index.blending import build_blending_indices, exact_weights, nanoset_blended_order
from shardtok.index.cache import cached_gpt_indices
from shardtok.index.gpt import GptIndices, build_gpt_indices, build_sample_idx

__all__ = [
    "GptIndices",
    "build_blending_indices",
    "build_gpt_indices",
    "build_sample_idx",
    "cached_gpt_indices",
    "exact_weights",
    "nanoset_blended_order",
]
