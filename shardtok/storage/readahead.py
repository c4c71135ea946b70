"""Read-ahead: a stream that fetches the next block while the current one is read.

Memory is bounded: a ``BlockStream`` holds at most two blocks, the one being read and the one
being fetched.
"""

from __future__ import annotations

import io
import queue
import threading
from concurrent.futures import Future

from shardtok.storage.base import FIRST_BLOCK_SIZE, BlockFetcher, Cancelled

_END = object()  # queued after the last block


class BlockStream(io.RawIOBase):
    """Sequential reader over a ``BlockFetcher`` (a ``RemoteSource``) with one background fetcher thread.

    ``read(n)`` returns exactly ``n`` bytes until the end of the object, then ``b""``. A read
    error is raised where it happened, after every byte before it was returned.
    """

    def __init__(
        self, source: BlockFetcher, offset: int, block_size: int, first: Future | None = None
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
        step = min(FIRST_BLOCK_SIZE, block_size)
        try:
            if first is not None:
                self._slots.acquire()
                block = first.result()
                self._blocks.put(block)
                pos += len(block)
                step = min(max(2 * len(block), step), block_size)
            while pos < self._end:
                self._slots.acquire()
                if self._cancel.is_set():
                    return
                length = min(step, self._end - pos)
                step = min(2 * step, block_size)
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
