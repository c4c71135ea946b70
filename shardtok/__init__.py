"""shardtok: tokenized tar shards with Megatron-compatible indices, streamed as packed sequences.

The core (everything except :mod:`shardtok.torch`) imports without torch.
"""

import logging

from shardtok.errors import (
    BadRecordError,
    CorruptShardError,
    ResumeStateError,
    ShardtokError,
    StorageError,
    TokenizerMismatchError,
    UsageError,
)

__version__ = "0.4.0"

# The stdlib's advice for libraries: records go nowhere until the application configures
# logging (the shardtok command does, for its own run), and never to Python's last-resort
# stderr handler behind the application's back.
logging.getLogger("shardtok").addHandler(logging.NullHandler())

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
