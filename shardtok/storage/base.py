"""The common ground of every source: ``ByteSource``, ``ReadStream`` and the errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol, TypeVar

from shardtok.errors import StorageError

DEFAULT_BLOCK_SIZE = 16 << 20  # read-ahead block: large enough that latency does not bound speed
# A stream's first block is small and each next one doubles up to the block size: the head of a
# shard (json, idx, first frame) arrives after one small request, so the first batch is quick.
FIRST_BLOCK_SIZE = 1 << 20
T = TypeVar("T")


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The file or object does not exist (HTTP 404, NoSuchKey, ENOENT). Never retried."""


class AccessDeniedError(StorageError, PermissionError):
    """Credentials are missing or wrong, or lack permission (HTTP 401/403). Never retried."""


class Cancelled(Exception):
    """A background read was abandoned because its stream was closed."""


class ReadStream(Protocol):
    """What ``open_stream`` returns: a binary file open for sequential reading."""

    def read(self, size: int | None = -1, /) -> bytes: ...

    def readinto(self, buffer: Any, /) -> int | None: ...

    def tell(self) -> int: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


class BlockFetcher(Protocol):
    """What read-ahead needs of a source: its size and exact range reads that can be abandoned."""

    @property
    def size(self) -> int: ...

    def fetch(self, offset: int, length: int, cancel: Any = None) -> bytes: ...


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
    def open_stream(self, offset: int = 0) -> ReadStream:
        """A file-like reader from ``offset``: ``read(n)`` returns ``n`` bytes until the end,
        then ``b""``. Close it (or use ``with``)."""

    def stat_size(self) -> int:
        """The size, reading no byte of the object: for a check that needs nothing else of
        it (remote sources answer ``size`` with a GET of their head, which this avoids)."""
        return self.size

    def prefetch(self, offset: int = 0) -> None:  # noqa: B027 - optional for a source
        """Start fetching the start of a later ``open_stream(offset)`` in the background."""

    @property
    def retries(self) -> int:
        """How many times a request of this source was retried (0 for local files)."""
        return 0

    def cache_identity(self) -> str:
        """What names this object in a cache (no credentials). Sources whose object can change
        in place add a version (ETag) so that a changed object gets a new entry."""
        return f"{self.url}\0{self.size}"

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
