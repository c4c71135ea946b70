"""shardtok: tokenized tar shards with Megatron-compatible indices, streamed as packed sequences.

The core (everything except :mod:`shardtok.torch`) imports without torch.
"""

from shardtok.errors import (
    BadRecordError,
    CorruptShardError,
    ResumeStateError,
    ShardtokError,
    StorageError,
    TokenizerMismatchError,
    UsageError,
)

__version__ = "0.2.0"

__all__ = [
    "BadRecordError",
    "CorruptShardError",
    "ResumeStateError",
    "ShardtokError",
    "StorageError",
    "TokenizerMismatchError",
    "UsageError",
    "__version__",
]
