"""Entry points: ``open_source`` picks the ``ByteSource`` for a path or URL; ``read_bytes`` and
``exists`` serve whole small objects.

Local paths and ``file://`` URLs use plain OS I/O (``os.pread``, ``open``): nothing is copied or
cached. Remote URLs go through an fsspec backend with ``RetryPolicy`` retries that resume at the
exact byte where the last good one ended, so a read returns every byte once, in order, or raises
``StorageError`` naming the URL (never credentials) and the byte offset.
"""

from __future__ import annotations

import os

from shardtok.storage.base import DEFAULT_BLOCK_SIZE, ByteSource, ObjectNotFoundError
from shardtok.storage.cache import CachedSource, LocalCache
from shardtok.storage.local import LocalSource
from shardtok.storage.location import Location
from shardtok.storage.remote import RemoteSource
from shardtok.storage.retry import RetryPolicy


def open_source(
    url: str | os.PathLike | Location,
    storage_options: dict | None = None,
    retry: RetryPolicy | None = None,
    cache: LocalCache | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> ByteSource:
    """A ``ByteSource`` for a local path, ``file://`` URL or remote URL. Does no I/O yet.

    ``storage_options`` go to the fsspec backend (e.g. s3fs ``key``/``secret``/
    ``endpoint_url``/``client_kwargs``); without them the backend's standard configuration
    applies (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, profiles, ...). ``cache`` applies to
    remote URLs only: it wraps the remote source (``CachedSource``).
    """
    where = Location.of(url)
    if where.is_local:
        return LocalSource(where.local_path)
    source = RemoteSource(where.url, storage_options, retry, block_size)
    return source if cache is None else CachedSource(source, cache)


def read_bytes(
    url: str | os.PathLike | Location,
    storage_options: dict | None = None,
    retry: RetryPolicy | None = None,
) -> bytes:
    """The whole object (for small ones such as ``index.json``)."""
    with open_source(url, storage_options, retry) as source:
        return source.read_range(0, source.size)


def exists(
    url: str | os.PathLike | Location,
    storage_options: dict | None = None,
    retry: RetryPolicy | None = None,
) -> bool:
    """True if the file or object exists; other failures (e.g. access denied) still raise."""
    where = Location.of(url)
    if where.is_local:
        return os.path.isfile(where.local_path)
    try:
        with open_source(url, storage_options, retry) as source:
            return source.size >= 0
    except ObjectNotFoundError:
        return False
