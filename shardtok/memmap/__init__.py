"""The random-access path: Megatron GPTDataset samples over local, memory-mapped tokens."""

from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import ConcatTokens, open_local_data, open_local_tokens

__all__ = ["ConcatTokens", "GPTSamples", "open_local_data", "open_local_tokens"]
