"""The byte layer: open local paths, ``file://``, ``http(s)://``, ``s3://`` and ``gs://`` as
streams or byte ranges, with retries that lose no byte, and an optional bounded local cache.

    from shardtok.storage import open_source
    src = open_source("s3://bucket/ds/shard-000003.tar")
    src.size, src.read_range(0, 512)
    with src.open_stream() as f:
        header = f.read(512)

See docs/STORAGE.md. This layer knows nothing of shards.
"""

from shardtok.storage.base import AccessDeniedError, ByteSource, ObjectNotFoundError
from shardtok.storage.cache import CachedSource, LocalCache
from shardtok.storage.location import Location
from shardtok.storage.retry import RetryPolicy
from shardtok.storage.source import exists, open_source, read_bytes

__all__ = [
    "AccessDeniedError",
    "ByteSource",
    "CachedSource",
    "LocalCache",
    "Location",
    "ObjectNotFoundError",
    "RetryPolicy",
    "exists",
    "open_source",
    "read_bytes",
]
