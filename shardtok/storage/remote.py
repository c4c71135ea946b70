"""Remote objects through fsspec backends, with retries that resume at the exact byte.

Every read returns each byte once, in order, or raises ``StorageError`` naming the URL (never
credentials) and the byte offset.

Round trips are what a distant store charges for, so the first request for an object is a GET
of its head (``FIRST_BLOCK_SIZE`` bytes) that also tells its size and ETag, rather than a HEAD
followed by a GET: ``index.json`` and a shard's head (json, idx, first frame) each take one round
trip. The head is kept (at most one first block per open source) and serves the range reads and
the first stream block that fall inside it. Every complete request feeds the process's estimate
of the link (``readahead_plan``), from which streams size their read-ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from shardtok.errors import StorageError
from shardtok.storage.backends import Backend, ObjectInfo, Progress
from shardtok.storage.base import (
    DEFAULT_BLOCK_SIZE,
    FIRST_BLOCK_SIZE,
    AccessDeniedError,
    ByteSource,
    Cancelled,
    ObjectNotFoundError,
    ReadStream,
)
from shardtok.storage.endpoints import check_first_contact, endpoint_of, note_reached
from shardtok.storage.location import display_url
from shardtok.storage.readahead import BlockStream
from shardtok.storage.readahead_plan import link_of, sample_of
from shardtok.storage.retry import Redactor, RetryPolicy, classify

logger = logging.getLogger(__name__)
T = TypeVar("T")


class RemoteSource(ByteSource):
    """An object behind an fsspec backend (``s3://``, ``gs://``, ``http(s)://``, ...)."""

    def __init__(
        self,
        url: str,
        storage_options: dict | None = None,
        retry: RetryPolicy | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ):
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.url = display_url(url)
        self.retry = retry or RetryPolicy()
        self.block_size = block_size
        self.endpoint = str((storage_options or {}).get("endpoint_url") or "")
        self._backend = Backend(url, storage_options, self.retry)
        self._endpoint = endpoint_of(url, storage_options)
        self._redact = Redactor({"options": storage_options, "url": _url_secrets(url)})
        self._info: ObjectInfo | None = None
        self._info_lock = threading.Lock()
        self._lock = threading.Lock()
        self._retries = 0
        self._prefetched: tuple[int, int, Future] | None = None  # offset, length, block
        self._head = b""  # the object's first bytes, from the GET that told its size

    # -- metadata --------------------------------------------------------------------------
    def info(self) -> ObjectInfo:
        """Size and ETag, from one GET of the head (or a HEAD where that cannot tell them);
        threads asking at once wait for it."""
        with self._info_lock:
            if self._info is None:
                info, head = self._get_head(min(FIRST_BLOCK_SIZE, self.block_size))
                if info is None:
                    info = self._with_retries(self._backend.head, lambda: None)
                self._info, self._head = info, head
                logger.debug("%s: %d bytes, ETag %s", self.url, info.size, info.etag)
            return self._info

    def _get_head(self, length: int) -> tuple[ObjectInfo | None, bytes]:
        """(size and ETag, the first `length` bytes) from one GET; a retry asks for the rest of
        the head only, with If-Match. (None, b"") where a GET cannot tell the size."""
        parts: list[bytes] = []
        received = 0
        info: ObjectInfo | None = None
        unsupported = False

        def attempt() -> None:
            nonlocal received, info, unsupported
            progress = Progress()
            sent = time.monotonic()
            try:
                if info is None:
                    unsupported = self._backend.read_head(length, progress) is None
                else:
                    want = min(length, info.size) - received
                    self._backend.read(received, want, progress, info.etag)
            finally:
                info = info or progress.info
                parts.extend(progress.chunks)
                received += progress.done
            if received == progress.done:  # one clean request: a measure of the link
                self._observe(sent, progress)

        def finished() -> bool:
            return info is not None and received == min(length, info.size)

        self._with_retries(attempt, lambda: received if info is not None else None, None, finished)
        return (None, b"") if unsupported else (info, b"".join(parts))

    def _observe(self, sent: float, progress: Progress) -> None:
        sample = sample_of(sent, progress.first_at, time.monotonic(), progress.done)
        if sample is not None:
            link_of(self._endpoint).observe(sample)

    @property
    def size(self) -> int:
        return self.info().size

    @property
    def retries(self) -> int:
        return self._retries

    # -- reading ---------------------------------------------------------------------------
    def read_range(self, offset: int, length: int) -> bytes:
        self._check_range(offset, length)
        return self.fetch(offset, length)

    def open_stream(self, offset: int = 0) -> ReadStream:
        if not 0 <= offset <= self.size:
            raise StorageError(self.url, offset, f"offset past the end ({self.size} bytes)")
        first = None
        with self._lock:
            if self._prefetched is not None and self._prefetched[0] == offset:
                first = self._prefetched[1:]
            self._prefetched = None
            if first is None and offset < len(self._head):  # the head starts the stream
                done: Future = Future()
                done.set_result(self._head[offset:])
                first = (len(self._head) - offset, done)
        window = link_of(self._endpoint).window
        return BlockStream(
            self, offset, self.block_size, self.retry.read_ahead_bytes, first, window
        )

    def prefetch(self, offset: int = 0) -> None:
        """Fetch the first block from ``offset`` in the background for the next ``open_stream``
        (from offset 0: the GET of the head that also tells the size)."""
        with self._lock:
            if self._prefetched is not None:
                return
            future: Future = Future()
            length = min(FIRST_BLOCK_SIZE, self.block_size)
            self._prefetched = (offset, length, future)

        def run() -> None:
            try:
                future.set_result(self.fetch(offset, min(length, max(self.size - offset, 0))))
            except BaseException as exc:  # handed to whoever uses the block
                future.set_exception(exc)

        threading.Thread(target=run, name="shardtok-prefetch", daemon=True).start()

    def fetch(self, offset: int, length: int, cancel: threading.Event | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` with retries that resume where data stopped."""
        if length == 0:
            return b""
        etag = self.info().etag
        head = self._head
        if offset + length <= len(head):
            return head[offset : offset + length]
        parts: list[bytes] = []
        received = 0

        def attempt() -> None:
            nonlocal received
            if received == length:
                return
            progress = Progress()
            sent = time.monotonic()
            try:
                self._backend.read(offset + received, length - received, progress, etag)
            finally:
                parts.extend(progress.chunks)
                received += progress.done
            if received == length and progress.done == length:  # one clean request
                self._observe(sent, progress)

        self._with_retries(attempt, lambda: offset + received, cancel, lambda: received == length)
        return b"".join(parts)

    def stat_size(self) -> int:
        """The size from a HEAD when nothing was read yet (no byte of the object)."""
        with self._info_lock:
            if self._info is None:
                self._info = self._with_retries(self._backend.head, lambda: None)
        return self._info.size

    def cache_identity(self) -> str:
        """What names this object in a cache: URL, endpoint, size and ETag (no credentials).

        Asked with a HEAD when nothing was read yet: on a cache hit no byte of the object
        is needed, so a GET of its head would be wasted."""
        self.stat_size()
        info = self._info
        return f"{self.url}\0{self.endpoint}\0{info.size}\0{info.etag or ''}"

    # -- retries ---------------------------------------------------------------------------
    def _with_retries(
        self,
        action: Callable[[], T],
        where: Callable[[], int | None],
        cancel: threading.Event | None = None,
        finished: Callable[[], bool] | None = None,
    ) -> T:
        policy = self.retry
        delays = policy.delays()
        for attempt in range(1, policy.max_attempts + 1):
            try:
                result = action()
                note_reached(self._endpoint)
                return result
            except Exception as exc:
                kind = classify(exc)
                if kind is None:
                    raise
                if finished is not None and finished():
                    return None  # type: ignore[return-value]  # everything arrived anyway
                if kind == "transient":
                    # Nothing listening, or no such host, before the endpoint ever answered:
                    # a mistake in the configuration, not an outage. Fails now, named.
                    check_first_contact(exc, self.url, self._endpoint)
                reason, redacted = self._redact.describe(exc)
                cause = None if redacted else exc
                if kind.startswith("fatal"):
                    raise self._fatal(where(), kind.removeprefix("fatal: "), reason) from cause
                if attempt == policy.max_attempts:
                    raise StorageError(
                        self.url, where(), f"gave up after {attempt} attempts; last: {reason}"
                    ) from cause
                delay = next(delays)
                with self._lock:
                    self._retries += 1
                offset = where()
                logger.warning(
                    "%s%s: %s; attempt %d/%d failed, retry in %.2f s",
                    self.url,
                    "" if offset is None else f" at byte offset {offset}",
                    reason,
                    attempt,
                    policy.max_attempts,
                    delay,
                )
                if cancel is not None:
                    if cancel.wait(delay):
                        raise Cancelled() from None
                else:
                    time.sleep(delay)
        raise AssertionError("unreachable")

    def _fatal(self, offset: int | None, what: str, reason: str) -> StorageError:
        if what == "not found":
            return ObjectNotFoundError(self.url, offset, f"not found ({reason})")
        if what.startswith("access denied"):
            return AccessDeniedError(self.url, offset, f"{what} ({reason})")
        return StorageError(self.url, offset, f"{what} ({reason})")

    def close(self) -> None:
        with self._lock:
            self._prefetched = None
            self._head = b""

    def __getstate__(self) -> dict:
        # Threads, locks and futures stay behind; a worker process re-fetches what it needs.
        state = self.__dict__.copy()
        for name in ("_lock", "_info_lock"):
            del state[name]
        state["_prefetched"] = None
        state["_head"] = b""  # a worker asks for what it reads
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._info_lock = threading.Lock()


def _url_secrets(url: str) -> dict:
    """user:password and query values of a URL, for the redactor."""
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
    secrets = {"password": parsed.password or ""}
    # Both as written and decoded: a client may print either form.
    raw = [part.partition("=")[2] for part in parsed.query.split("&")]
    decoded = [value for _, value in urllib.parse.parse_qsl(parsed.query)]
    for i, value in enumerate(raw + decoded):
        secrets[f"token{i}"] = value
    return secrets
