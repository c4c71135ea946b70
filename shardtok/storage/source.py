"""Entry points: ``open_source`` picks the ``ByteSource`` for a path or URL; ``read_bytes`` and
``exists`` serve whole small objects.

Local paths and ``file://`` URLs use plain OS I/O (``os.pread``, ``open``): nothing is copied or
cached. Remote URLs go through an fsspec backend with ``RetryPolicy`` retries that resume at the
exact byte where the last good one ended, so a read returns every byte once, in order, or raises
``StorageError`` naming the URL (never credentials) and the byte offset.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from shardtok.storage.base import DEFAULT_BLOCK_SIZE, ByteSource, ObjectNotFoundError
from shardtok.storage.local import LocalSource
from shardtok.storage.remote import RemoteSource
from shardtok.storage.retry import RetryPolicy
from shardtok.storage.urls import is_local, local_path

if TYPE_CHECKING:
    from shardtok.storage.cache import LocalCache


def open_source(
    url: str | os.PathLike,
    storage_options: dict | None = None,
    retry: RetryPolicy | None = None,
    cache: LocalCache | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> ByteSource:
    """A ``ByteSource`` for a local path, ``file://`` URL or remote URL. Does no I/O yet.

    ``storage_options`` go to the fsspec backend (e.g. s3fs ``key``/``secret``/
    ``endpoint_url``/``client_kwargs``); without them the backend's standard configuration
    applies (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, profiles, ...). ``cache`` applies to
    remote URLs only.
    """
    url = os.fspath(url)
    if is_local(url):
        return LocalSource(local_path(url))
    return RemoteSource(url, storage_options, retry, cache, block_size)


def read_bytes(
    url: str | os.PathLike, storage_options: dict | None = None, retry: RetryPolicy | None = None
) -> bytes:
    """The whole object (for small ones such as ``index.json``)."""
    with open_source(url, storage_options, retry) as source:
        return source.read_range(0, source.size)


def exists(
    url: str | os.PathLike, storage_options: dict | None = None, retry: RetryPolicy | None = None
) -> bool:
    """True if the file or object exists; other failures (e.g. access denied) still raise."""
    url = os.fspath(url)
    if is_local(url):
        return os.path.isfile(local_path(url))
    try:
        with open_source(url, storage_options, retry) as source:
            return source.size >= 0
    except ObjectNotFoundError:
        return False
