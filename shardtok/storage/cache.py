"""``LocalCache``: whole-object copies of remote objects in a local folder, bounded in size, and
``CachedSource``, which reads any ``ByteSource`` through such a cache.

The cache wraps a source rather than a source owning a cache, so the remote source knows
nothing of caching and this module needs nothing but the ``ByteSource`` interface.

Layout of the folder::

    objects/<hash>-<name>   one file per cached object; hash of URL, endpoint, size and ETag
    sums/<hash>-<name>      the object's crc32 as downloaded (8 hex digits)
    tmp/<...>.part          downloads in progress (renamed into objects/ when complete)
    locks/<xx>.lock         256 lock stripes: one download of an object at a time
    .lock                   held around eviction + commit

An object appears in ``objects/`` only complete (written to ``tmp/``, fsynced, renamed). The
least recently used objects (access time is recorded in each file's mtime) are deleted before a
new one is committed, so the cache holds at most ``max_bytes``, or a single object if that one
is larger. Readers keep an open descriptor, so an object evicted while it is read stays
readable to them. Several processes on one node may share a folder: the locks are ``flock``s.
Local paths are never cached (``open_source`` wraps remote sources only).

A cached object is checked against the crc32 its download recorded when a ``LocalCache`` first
opens it. One that fails (a disk error, a file changed by hand) is evicted with a warning
naming the cache file and fetched again; only a fresh copy that fails too is an error, and it
names the object.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from shardtok._process import process_alive
from shardtok.errors import StorageError
from shardtok.storage.base import ByteSource, ReadStream
from shardtok.storage.local import LocalSource

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# A .part no one wrote to for this long is abandoned; sooner if its process is gone (the pid
# check alone could misjudge a process in another container sharing the folder).
_ABANDONED_SECONDS = 3600.0
_ABANDONED_DEAD_PID_SECONDS = 600.0
_COPY_CHUNK = 8 << 20

log = logging.getLogger(__name__)


class _Damaged(Exception):
    """A cached object whose bytes are not those its download recorded."""


class LocalCache:
    def __init__(self, folder: str | os.PathLike, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        self._objects = self.folder / "objects"
        self._sums = self.folder / "sums"
        self._tmp = self.folder / "tmp"
        self._locks = self.folder / "locks"
        for d in (self._objects, self._sums, self._tmp, self._locks):
            d.mkdir(parents=True, exist_ok=True)
        # Files this process has checked: read once per process, not on every open.
        self._checked: set[tuple[int, int, int, int]] = set()
        self._checked_lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        LocalCache.__init__(self, state["folder"], state["max_bytes"])

    def __repr__(self) -> str:
        return f"LocalCache({str(self.folder)!r}, max_bytes={self.max_bytes})"

    # -- public ----------------------------------------------------------------------------
    def open(self, source: ByteSource) -> LocalSource:
        """A local copy of ``source``, downloading it first if it is not cached."""
        digest = hashlib.sha256(source.cache_identity().encode()).hexdigest()[:32]
        name = _UNSAFE.sub("_", source.url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        path = self._objects / f"{digest}-{name}"
        size = source.size
        label = f"{source.url} (cached as {path})"
        with contextlib.suppress(_Damaged):  # evicted under the lock below, by one process
            found = self._open_existing(path, size, label)
            if found is not None:
                return found
        with _flock(self._locks / f"{digest[:2]}.lock"):
            try:  # another process may have won, or already replaced a damaged copy
                found = self._open_existing(path, size, label)
                if found is not None:
                    return found
            except _Damaged as exc:
                self._evict_damaged(path, source, exc)
                return self._download(source, path, size, label, check_again=True)
            return self._download(source, path, size, label)

    def total_bytes(self) -> int:
        """Bytes held in committed objects now."""
        return sum(size for _, size, _ in self._entries())

    # -- internals -------------------------------------------------------------------------
    def _open_existing(self, path: Path, size: int, label: str) -> LocalSource | None:
        """The cached copy at `path`, checked (``_Damaged`` if it fails); None if absent."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            recorded = self._recorded_sum(path)
            if recorded is None:  # evicted meanwhile, or from a version that kept no sums
                os.close(fd)
                return None
            if st.st_size != size:
                raise _Damaged(f"{st.st_size:,} bytes where the object has {size:,}")
            key = (st.st_dev, st.st_ino, st.st_size, recorded)
            with self._checked_lock:
                known = key in self._checked
            if not known:
                found = _fd_crc32(fd)
                if found != recorded:
                    raise _Damaged(f"crc32 {found:08x}, recorded {recorded:08x} when downloaded")
                with self._checked_lock:
                    self._checked.add(key)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: our fd still reads
            _touch(path)
        return LocalSource(path, fd=fd, label=label)

    def _recorded_sum(self, path: Path) -> int | None:
        try:
            text = (self._sums / path.name).read_text().strip()
        except FileNotFoundError:
            return None
        if not re.fullmatch(r"[0-9a-f]{8}", text):
            raise _Damaged(f"its recorded crc32 {text[:20]!r} is not 8 hex digits")
        return int(text, 16)

    def _evict_damaged(self, path: Path, source: ByteSource, exc: _Damaged) -> None:
        log.warning(
            "%s: the cached copy of %s fails its check (%s): evicted, fetching it again",
            path,
            source.url,
            exc,
        )
        for each in (path, self._sums / path.name):
            with contextlib.suppress(FileNotFoundError):
                each.unlink()

    def _download(
        self, source: ByteSource, path: Path, size: int, label: str, check_again: bool = False
    ) -> LocalSource:
        """Fetch `source` into `path`. `check_again`: the copy before this one was damaged, so
        this one is read back and checked before it is used (a second failure is an error)."""
        tmp = self._tmp / f"{path.name}.{os.getpid()}.{time.monotonic_ns()}.part"
        crc = 0
        try:
            with open(tmp, "wb") as out, source.open_stream(0) as stream:
                while chunk := stream.read(_COPY_CHUNK):
                    crc = zlib.crc32(chunk, crc)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())  # never commit a file whose bytes are not on disk
            written = tmp.stat().st_size
            if written != size:
                raise StorageError(source.url, written, f"downloaded {written} of {size} bytes")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                if check_again and _fd_crc32(fd) != crc:
                    raise StorageError(
                        source.url,
                        None,
                        f"the cached copy fails its check again after a fresh download (crc32 "
                        f"of {tmp} differs from the bytes received): the cache folder "
                        f"{self.folder} cannot hold it intact",
                    )
                with _flock(self.folder / ".lock"):
                    self._make_room(size)
                    self._write_sum(path, crc)  # before the object: no object without its sum
                    _touch(tmp)
                    os.rename(tmp, path)
                st = os.fstat(fd)
                with self._checked_lock:
                    self._checked.add((st.st_dev, st.st_ino, st.st_size, crc))
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return LocalSource(path, fd=fd, label=label)

    def _write_sum(self, path: Path, crc: int) -> None:
        tmp = self._sums / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_text(f"{crc:08x}\n")
        os.rename(tmp, self._sums / path.name)

    def _entries(self) -> list[tuple[int, int, str]]:
        entries = []
        with os.scandir(self._objects) as it:
            for entry in it:
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime_ns, st.st_size, entry.path))
        return entries

    def _make_room(self, incoming: int) -> None:
        """Delete least recently used objects until ``incoming`` more bytes fit. Under .lock."""
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        for _, size, entry_path in entries:
            if total + incoming <= self.max_bytes:
                break
            for each in (entry_path, os.path.join(self._sums, os.path.basename(entry_path))):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(each)
            total -= size
        self._remove_abandoned_downloads()

    def _remove_abandoned_downloads(self) -> None:
        now = time.time()
        with os.scandir(self._tmp) as it:
            for entry in it:
                pid = _pid_of(entry.name)
                try:
                    idle = now - entry.stat().st_mtime
                except FileNotFoundError:
                    continue
                dead = pid is not None and not process_alive(pid)
                if idle > _ABANDONED_SECONDS or (dead and idle > _ABANDONED_DEAD_PID_SECONDS):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


class CachedSource(ByteSource):
    """``source`` read through ``cache``: the first read (or ``prefetch``) copies the whole
    object into the cache; every read is then a local one."""

    def __init__(self, source: ByteSource, cache: LocalCache):
        self.source = source
        self.cache = cache
        self.url = source.url
        self._copy: LocalSource | None = None
        self._lock = threading.Lock()
        self._prefetching = False

    @property
    def size(self) -> int:
        # The identity first: a remote source answers it with a HEAD, where its size alone
        # would GET the head of the object, which a cache hit never reads.
        self.source.cache_identity()
        return self.source.size

    @property
    def retries(self) -> int:
        return self.source.retries

    def cache_identity(self) -> str:
        return self.source.cache_identity()

    def _local(self) -> LocalSource:
        with self._lock:
            if self._copy is None:
                self._copy = self.cache.open(self.source)
            return self._copy

    def read_range(self, offset: int, length: int) -> bytes:
        self._check_range(offset, length)
        return self._local().read_range(offset, length)

    def open_stream(self, offset: int = 0) -> ReadStream:
        return self._local().open_stream(offset)

    def prefetch(self, offset: int = 0) -> None:
        """Download the whole object into the cache in the background."""
        with self._lock:
            if self._prefetching or self._copy is not None:
                return
            self._prefetching = True

        def run() -> None:
            # A failed download leaves nothing behind; the next read tries again and raises.
            with contextlib.suppress(Exception):
                self._local()

        threading.Thread(target=run, name="shardtok-cache-fill", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            if self._copy is not None:
                self._copy.close()
                self._copy = None
        self.source.close()

    def __getstate__(self) -> dict:
        # The local copy's descriptor stays behind; the receiving process opens the cache again.
        return {"source": self.source, "cache": self.cache}

    def __setstate__(self, state: dict) -> None:
        CachedSource.__init__(self, state["source"], state["cache"])


def _touch(path: Path) -> None:
    """Record an access. The clock is set explicitly: the kernel's file timestamps are
    coarse (a few ms), too coarse to order accesses that follow each other quickly."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def _fd_crc32(fd: int) -> int:
    crc, offset = 0, 0
    while block := os.pread(fd, _COPY_CHUNK, offset):
        crc = zlib.crc32(block, crc)
        offset += len(block)
    return crc


def _pid_of(tmp_name: str) -> int | None:
    parts = tmp_name.rsplit(".", 3)  # <name>.<pid>.<ns>.part
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                break
            except OSError as exc:  # interrupted by a signal: try again
                if exc.errno != errno.EINTR:
                    raise
        yield
    finally:
        os.close(fd)  # releases the lock
