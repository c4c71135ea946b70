"""``Prefetcher``: starts on the next object while the current one is consumed.

It holds one first block per object it was asked to prefetch (at most ``depth`` of them).
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

from shardtok.storage.base import DEFAULT_BLOCK_SIZE, ByteSource, ReadStream
from shardtok.storage.cache import LocalCache
from shardtok.storage.retry import RetryPolicy
from shardtok.storage.source import open_source


class Prefetcher:
    """Opens sources and starts fetching the next ones while the current one is consumed.

    The stream layer calls ``prefetch(next_url)`` when it starts reading a shard and later
    ``open_stream(next_url)``, which starts from the block fetched meanwhile. It keeps at most
    ``depth`` prefetched sources (older ones are dropped with their blocks). With a cache the
    whole next object is downloaded into the cache instead. Local files get a read-ahead hint.
    """

    def __init__(
        self,
        storage_options: dict | None = None,
        retry: RetryPolicy | None = None,
        cache: LocalCache | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        depth: int = 1,
    ):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.storage_options = storage_options
        self.retry = retry
        self.cache = cache
        self.block_size = block_size
        self.depth = depth
        self._pending: OrderedDict[tuple[str, int], ByteSource] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _open(self, url: str) -> ByteSource:
        return open_source(url, self.storage_options, self.retry, self.cache, self.block_size)

    def prefetch(self, url: str, offset: int = 0) -> None:
        """Start fetching ``url`` from ``offset`` in the background (no-op if already going)."""
        key = (os.fspath(url), offset)
        with self._lock:
            self._forget_parent_process()
            if key in self._pending:
                return
            source = self._open(key[0])
            self._pending[key] = source
            while len(self._pending) > self.depth:
                self._pending.popitem(last=False)[1].close()
        source.prefetch(offset)

    def source(self, url: str, offset: int = 0) -> ByteSource:
        """The prefetched source for (url, offset), or a fresh one. The caller closes it."""
        with self._lock:
            self._forget_parent_process()
            source = self._pending.pop((os.fspath(url), offset), None)
        return source if source is not None else self._open(url)

    def open_stream(self, url: str, offset: int = 0) -> _ClosingStream:
        """A stream of ``url`` from ``offset``; closing it also closes its source."""
        source = self.source(url, offset)
        return _ClosingStream(source.open_stream(offset), source)

    def _forget_parent_process(self) -> None:
        # Futures and threads of a parent process do not exist after a fork.
        if self._pid != os.getpid():
            self._pending.clear()
            self._pid = os.getpid()

    def close(self) -> None:
        with self._lock:
            while self._pending:
                self._pending.popitem()[1].close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ClosingStream(io.RawIOBase):
    """Forwards reads to a stream and closes the source along with it."""

    def __init__(self, stream: ReadStream, source: ByteSource):
        super().__init__()
        self._stream = stream
        self._source = source

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        return self._stream.read(size)

    def readinto(self, buffer) -> int:
        return self._stream.readinto(buffer) or 0

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self._source.close()
        super().close()
