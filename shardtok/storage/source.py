"""``ByteSource``: one object (a local file or a remote URL) read by byte range or as a stream.

Local paths and ``file://`` URLs use plain OS I/O (``os.pread``, ``open``): nothing is copied or
cached. Remote URLs go through an fsspec backend with ``RetryPolicy`` retries that resume at the
exact byte where the last good one ended, so a read returns every byte once, in order, or raises
``StorageError`` naming the URL (never credentials) and the byte offset.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from shardtok.errors import StorageError
from shardtok.storage.backends import Backend, ObjectInfo, Progress
from shardtok.storage.retry import Redactor, RetryPolicy, classify
from shardtok.storage.urls import display_url, is_local, local_path

if TYPE_CHECKING:
    from shardtok.storage.cache import LocalCache

logger = logging.getLogger("shardtok.storage")

DEFAULT_BLOCK_SIZE = 16 << 20  # read-ahead block: large enough that latency does not bound speed
T = TypeVar("T")


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The file or object does not exist (HTTP 404, NoSuchKey, ENOENT). Never retried."""


class AccessDeniedError(StorageError, PermissionError):
    """Credentials are missing or wrong, or lack permission (HTTP 401/403). Never retried."""


class Cancelled(Exception):
    """A background read was abandoned because its stream was closed."""


class ByteSource(ABC):
    """One object, read by range (``read_range``) or sequentially (``open_stream``)."""

    url: str  # safe to print: no credentials
    local_path: str | None = None  # set for local files (the stream layer may memory-map them)

    @property
    @abstractmethod
    def size(self) -> int:
        """Size in bytes (stat or HEAD, done once)."""

    @abstractmethod
    def read_range(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or ``StorageError``."""

    @abstractmethod
    def open_stream(self, offset: int = 0) -> io.RawIOBase:
        """A file-like reader from ``offset``: ``read(n)`` returns ``n`` bytes until the end,
        then ``b""``. Close it (or use ``with``)."""

    def prefetch(self, offset: int = 0) -> None:  # noqa: B027 - optional for a source
        """Start fetching the start of a later ``open_stream(offset)`` in the background."""

    @property
    def retries(self) -> int:
        """How many times a request of this source was retried (0 for local files)."""
        return 0

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release file descriptors and prefetched blocks."""

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _check_range(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0:
            raise ValueError(f"offset and length must be >= 0, got {offset}, {length}")
        if offset + length > self.size:
            raise StorageError(
                self.url,
                offset,
                f"range of {length} bytes goes past the end of the object ({self.size} bytes)",
            )


class LocalSource(ByteSource):
    """A local file, read with ``os.pread`` and plain ``open``. Never copied or deleted.

    ``fd`` may hand over an open descriptor (the cache does), so that the file stays readable
    even if it is unlinked meanwhile.
    """

    def __init__(self, path: str | os.PathLike, *, fd: int | None = None, label: str = ""):
        self.local_path = os.fspath(path)
        self.url = label or self.local_path
        self._fd = fd
        self._fd_pid = os.getpid() if fd is not None else None
        self._owns_path = fd is None  # may reopen by path (a handed-over fd must be kept)
        self._size: int | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> str:
        """The file's path (the name the format layer's readers look for to memory-map)."""
        return self.local_path

    def _error(self, exc: OSError, offset: int | None = None) -> StorageError:
        reason = f"{type(exc).__name__}: {exc.strerror or exc}"
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(self.url, offset, "not found")
        if isinstance(exc, PermissionError):
            return AccessDeniedError(self.url, offset, reason)
        return StorageError(self.url, offset, reason)

    def _descriptor(self) -> int:
        with self._lock:
            if self._fd is None or (self._owns_path and self._fd_pid != os.getpid()):
                try:
                    self._fd = os.open(self.local_path, os.O_RDONLY)
                except OSError as exc:
                    raise self._error(exc) from None
                self._fd_pid = os.getpid()
            return self._fd

    @property
    def size(self) -> int:
        if self._size is None:
            try:
                self._size = os.fstat(self._descriptor()).st_size
            except OSError as exc:
                raise self._error(exc) from None
        return self._size

    def read_range(self, offset: int, length: int) -> bytes:
        self._check_range(offset, length)
        fd = self._descriptor()
        try:
            data = os.pread(fd, length, offset)
            while len(data) < length:  # pread may stop short on huge reads
                more = os.pread(fd, length - len(data), offset + len(data))
                if not more:
                    raise StorageError(self.url, offset + len(data), "file shrank while reading")
                data += more
        except OSError as exc:
            raise self._error(exc, offset) from None
        return data

    def open_stream(self, offset: int = 0) -> io.RawIOBase:
        if not 0 <= offset <= self.size:
            raise StorageError(self.url, offset, f"offset past the end ({self.size} bytes)")
        if not self._owns_path:
            return io.BufferedReader(_PreadStream(self._descriptor(), offset), 1 << 20)
        try:
            f = open(self.local_path, "rb")  # noqa: SIM115 - returned to the caller
        except OSError as exc:
            raise self._error(exc, offset) from None
        f.seek(offset)
        return f

    def prefetch(self, offset: int = 0) -> None:
        # Ask the kernel to start reading; costs nothing if the pages are already cached.
        if hasattr(os, "posix_fadvise"):
            # A hint only: the real read reports any error.
            with contextlib.suppress(OSError, StorageError):
                os.posix_fadvise(
                    self._descriptor(), offset, DEFAULT_BLOCK_SIZE, os.POSIX_FADV_WILLNEED
                )

    def close(self) -> None:
        with self._lock:
            if self._fd is not None and self._fd_pid == os.getpid():
                os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict:
        # A descriptor does not cross processes: the copy reopens the file by its path.
        return {"path": self.local_path, "label": self.url}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], label=state["label"])


class _PreadStream(io.RawIOBase):
    """Sequential reads on a shared descriptor without touching its file offset."""

    def __init__(self, fd: int, offset: int):
        super().__init__()
        self._fd = fd
        self._pos = offset

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = os.pread(self._fd, len(buffer), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos


class RemoteSource(ByteSource):
    """An object behind an fsspec backend (``s3://``, ``gs://``, ``http(s)://``, ...)."""

    def __init__(
        self,
        url: str,
        storage_options: dict | None = None,
        retry: RetryPolicy | None = None,
        cache: LocalCache | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ):
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.url = display_url(url)
        self.retry = retry or RetryPolicy()
        self.cache = cache
        self.block_size = block_size
        self.endpoint = str((storage_options or {}).get("endpoint_url") or "")
        self._backend = Backend(url, storage_options, self.retry)
        self._redact = Redactor({"options": storage_options, "url": _url_secrets(url)})
        self._info: ObjectInfo | None = None
        self._info_lock = threading.Lock()
        self._lock = threading.Lock()
        self._retries = 0
        self._prefetched: tuple[int, Future] | None = None
        self._cached: LocalSource | None = None
        self._cache_lock = threading.Lock()

    # -- metadata --------------------------------------------------------------------------
    def info(self) -> ObjectInfo:
        """Size and ETag, from one HEAD request (threads asking at once wait for it)."""
        with self._info_lock:
            if self._info is None:
                self._info = self._with_retries(self._backend.head, lambda: None)
            return self._info

    @property
    def size(self) -> int:
        return self.info().size

    @property
    def retries(self) -> int:
        return self._retries

    # -- reading ---------------------------------------------------------------------------
    def read_range(self, offset: int, length: int) -> bytes:
        self._check_range(offset, length)
        if self.cache is not None:
            return self._cached_copy().read_range(offset, length)
        return self.fetch(offset, length)

    def open_stream(self, offset: int = 0) -> io.RawIOBase:
        from shardtok.storage.readahead import BlockStream

        if self.cache is not None:
            return self._cached_copy().open_stream(offset)
        if not 0 <= offset <= self.size:
            raise StorageError(self.url, offset, f"offset past the end ({self.size} bytes)")
        first = None
        with self._lock:
            if self._prefetched is not None and self._prefetched[0] == offset:
                first = self._prefetched[1]
            self._prefetched = None
        return BlockStream(self, offset, self.block_size, first)

    def prefetch(self, offset: int = 0) -> None:
        """Without a cache: fetch the first block from ``offset`` for the next ``open_stream``.
        With a cache: download the whole object into the cache."""
        with self._lock:
            if self._prefetched is not None:
                return
            future: Future = Future()
            self._prefetched = (offset, future)

        def run() -> None:
            try:
                if self.cache is not None:
                    result: object = self._cached_copy()
                else:
                    length = min(self.block_size, max(self.size - offset, 0))
                    result = self.fetch(offset, length)
                future.set_result(result)
            except BaseException as exc:  # handed to whoever uses the block
                future.set_exception(exc)

        threading.Thread(target=run, name="shardtok-prefetch", daemon=True).start()

    def fetch(self, offset: int, length: int, cancel: threading.Event | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` with retries that resume where data stopped."""
        if length == 0:
            return b""
        etag = self.info().etag
        parts: list[bytes] = []
        received = 0

        def attempt() -> None:
            nonlocal received
            if received == length:
                return
            progress = Progress()
            try:
                self._backend.read(offset + received, length - received, progress, etag)
            finally:
                parts.extend(progress.chunks)
                received += progress.done

        self._with_retries(attempt, lambda: offset + received, cancel, lambda: received == length)
        return b"".join(parts)

    def _cached_copy(self) -> LocalSource:
        with self._cache_lock:
            if self._cached is None:
                assert self.cache is not None
                self._cached = self.cache.open(self)
            return self._cached

    def cache_identity(self) -> str:
        """What names this object in a cache: URL, endpoint, size and ETag (no credentials)."""
        info = self.info()
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
                return action()
            except Exception as exc:
                kind = classify(exc)
                if kind is None:
                    raise
                if finished is not None and finished():
                    return None  # type: ignore[return-value]  # everything arrived anyway
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
                logger.warning(
                    "%s: byte offset %s: %s; retry %d of %d in %.2f s",
                    self.url,
                    where(),
                    reason,
                    attempt,
                    policy.max_attempts - 1,
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
        with self._cache_lock:
            if self._cached is not None:
                self._cached.close()
                self._cached = None

    def __getstate__(self) -> dict:
        # Threads, locks and futures stay behind; a worker process re-fetches what it needs.
        state = self.__dict__.copy()
        for name in ("_lock", "_cache_lock", "_info_lock"):
            del state[name]
        state["_prefetched"] = None
        state["_cached"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._info_lock = threading.Lock()


def _url_secrets(url: str) -> dict:
    """user:password and query values of a URL, for the redactor."""
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
    secrets = {"password": parsed.password or ""}
    for i, (_, value) in enumerate(urllib.parse.parse_qsl(parsed.query)):
        secrets[f"token{i}"] = value
    return secrets


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
