"""Read-ahead: a stream that fetches the next block while the current one is read, and a
``Prefetcher`` that starts on the next object while the current one is consumed.

Memory is bounded: a ``BlockStream`` holds at most two blocks (the one being read and the one
being fetched), a ``Prefetcher`` one first block per object it was asked to prefetch.
"""

from __future__ import annotations

import io
import os
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING

from shardtok.storage.retry import RetryPolicy
from shardtok.storage.source import (
    DEFAULT_BLOCK_SIZE,
    ByteSource,
    Cancelled,
    RemoteSource,
    open_source,
)

if TYPE_CHECKING:
    from shardtok.storage.cache import LocalCache

_END = object()  # queued after the last block


class BlockStream(io.RawIOBase):
    """Sequential reader over a ``RemoteSource`` with one background fetcher thread.

    ``read(n)`` returns exactly ``n`` bytes until the end of the object, then ``b""``. A read
    error is raised where it happened, after every byte before it was returned.
    """

    def __init__(
        self, source: RemoteSource, offset: int, block_size: int, first: Future | None = None
    ):
        super().__init__()
        self._source = source
        self._pos = offset
        self._end = source.size
        self._blocks: queue.Queue = queue.Queue()
        # Each block holds a slot from the moment its fetch starts until the reader is done
        # with it: two slots, so one block is read while the next one downloads.
        self._slots = threading.Semaphore(2)
        self._cancel = threading.Event()
        self._current = memoryview(b"")
        self._used = 0  # bytes of _current already returned
        self._has_block = False
        self._finished = False
        self._thread = threading.Thread(
            target=self._fetch_blocks,
            args=(offset, block_size, first),
            name="shardtok-readahead",
            daemon=True,
        )
        self._thread.start()

    def _fetch_blocks(self, pos: int, block_size: int, first: Future | None) -> None:
        try:
            if first is not None:
                self._slots.acquire()
                block = first.result()
                self._blocks.put(block)
                pos += len(block)
            while pos < self._end:
                self._slots.acquire()
                if self._cancel.is_set():
                    return
                length = min(block_size, self._end - pos)
                block = self._source.fetch(pos, length, self._cancel)
                if self._cancel.is_set():
                    return
                self._blocks.put(block)
                pos += length
            self._blocks.put(_END)
        except Cancelled:
            return
        except BaseException as exc:  # raised to the reader in order
            self._blocks.put(exc)

    def _next_block(self) -> bool:
        if self._finished:
            return False
        if self._has_block:
            self._current = memoryview(b"")
            self._used = 0
            self._has_block = False
            self._slots.release()
        item = self._blocks.get()
        if item is _END:
            self._finished = True
            return False
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        self._current = memoryview(item)
        self._used = 0
        self._has_block = True
        return True

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        if size is None or size < 0:
            size = self._end - self._pos
        parts = []
        while size > 0:
            if self._used == len(self._current) and not self._next_block():
                break
            take = min(size, len(self._current) - self._used)
            parts.append(self._current[self._used : self._used + take])
            self._used += take
            self._pos += take
            size -= take
        return b"".join(parts)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            self._cancel.set()
            self._slots.release(2)  # wake the fetcher if it waits for a slot
            self._current = memoryview(b"")
            self._used = 0
            self._finished = True
            while True:  # drop queued blocks now rather than when the fetcher ends
                try:
                    self._blocks.get_nowait()
                except queue.Empty:
                    break
        super().close()


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

    def open_stream(self, url: str, offset: int = 0) -> io.RawIOBase:
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

    def __init__(self, stream, source: ByteSource):
        super().__init__()
        self._stream = stream
        self._source = source

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        return self._stream.read(size)

    def readinto(self, buffer) -> int:
        return self._stream.readinto(buffer)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self._source.close()
        super().close()
