"""Read-ahead: a stream that keeps ranged GETs in flight ahead of its reader.

How far ahead follows the link (``readahead_plan.window_bytes``: two blocks plus the measured
bandwidth-delay product); memory is bounded by ``read_ahead_bytes`` all the same: the bytes a
``BlockStream`` has requested and not yet handed out, the block being read included, never
exceed it (one request is always allowed, of at most that size, so a small cap still reads).
Requests are sized from a small first block doubling up to the block size, so a shard's head
arrives after one small request while later requests are large.
"""

from __future__ import annotations

import collections
import io
import threading
from collections.abc import Callable
from concurrent.futures import Future

from shardtok.storage.base import BlockFetcher, Cancelled
from shardtok.storage.readahead_plan import next_request_size

MAX_REQUESTS = 8  # ranged GETs one stream keeps in flight at most (a thread each)


class BlockStream(io.RawIOBase):
    """Sequential reader over a ``BlockFetcher`` (a ``RemoteSource``), reading ahead.

    ``read(n)`` returns exactly ``n`` bytes until the end of the object, then ``b""``. A read
    error is raised where it happened, after every byte before it was returned. Requests are
    issued by the reader's own calls (when it opens the stream and each time it finishes a
    block), so bytes are only requested when the reader has made room for them.

    `first`: (length, future) of the block at `offset` fetched earlier (a prefetch), or None.
    `window(block_size, cap)`: how many bytes to keep requested ahead (the link's estimate).
    """

    def __init__(
        self,
        source: BlockFetcher,
        offset: int,
        block_size: int,
        cap: int,
        first: tuple[int, Future] | None = None,
        window: Callable[[int, int], int] | None = None,
    ):
        super().__init__()
        self._source = source
        self._pos = offset
        self._end = source.size
        self._block_size = block_size
        self._cap = cap
        self._window = window or (lambda block_size, cap: min(block_size, cap))
        self._cancel = threading.Event()
        self._pending: collections.deque[tuple[int, Future]] = collections.deque()
        self._next = offset  # first byte not yet requested
        self._last_size: int | None = None  # size of the last request, for the ramp
        self._held = 0  # bytes requested and not yet released by the reader
        self.peak_held = 0  # the most ever held: at most `cap`
        self.requests = 0  # ranged GETs issued by this stream (a prefetched block not counted)
        self._current = memoryview(b"")
        self._current_size = 0
        self._used = 0  # bytes of _current already returned
        self._finished = False
        if first is not None and offset < self._end:
            length = min(first[0], self._end - offset)
            self._pending.append((length, first[1]))
            self._held = length
            self._next = offset + length
            self._last_size = length
        self._top_up()

    # -- requests ---------------------------------------------------------------------------
    def _top_up(self) -> None:
        """Issue requests while the window has room (called from the reader's thread only)."""
        window = min(self._window(self._block_size, self._cap), self._cap)
        while self._next < self._end and len(self._pending) < MAX_REQUESTS:
            size = next_request_size(self._last_size, self._block_size, window)
            length = min(size, self._end - self._next)
            if self._held and self._held + length > window:
                return
            future: Future = Future()
            # Daemon threads, not an executor's: a request still retrying when the process
            # ends must not hold its exit up.
            threading.Thread(
                target=self._fetch,
                args=(self._next, length, future),
                name="shardtok-readahead",
                daemon=True,
            ).start()
            self._pending.append((length, future))
            self._held += length
            self.peak_held = max(self.peak_held, self._held)
            self.requests += 1
            self._next += length
            self._last_size = size

    def _fetch(self, offset: int, length: int, future: Future) -> None:
        if self._cancel.is_set() or not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self._source.fetch(offset, length, self._cancel))
        except Cancelled:
            future.set_exception(Cancelled())
        except BaseException as exc:  # raised to the reader when it reaches this block
            future.set_exception(exc)

    def _next_block(self) -> bool:
        if self._finished:
            return False
        if self._current_size:
            self._held -= self._current_size
            self._current, self._current_size, self._used = memoryview(b""), 0, 0
            self._top_up()
        if not self._pending:
            self._finished = True
            return False
        length, future = self._pending.popleft()
        try:
            block = future.result()
        except BaseException:
            self._finished = True
            self._stop()
            raise
        self._current = memoryview(block)
        self._current_size = length
        self._used = 0
        return True

    # -- reading ----------------------------------------------------------------------------
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
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def tell(self) -> int:
        return self._pos

    def _stop(self) -> None:
        """Abandon every request: queued ones never start, running ones end at their next
        retry wait (a transfer under way finishes its block, then is dropped)."""
        self._cancel.set()
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        if not self.closed:
            self._stop()
            self._current = memoryview(b"")
            self._used = 0
            self._finished = True
        super().close()
