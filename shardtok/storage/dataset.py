"""Where the stream gets its bytes: one small seam between the stream and storage.

A dataset is a folder or URL prefix holding ``index.json`` and the shards. Local paths (and
``file://`` URLs) are read with plain files; any other URL goes through ``shardtok.storage``
(``open_source`` / ``read_bytes`` / ``join_url``), imported only when such a URL is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardtok.errors import CorruptShardError, StorageError
from shardtok.format.manifest import MANIFEST_NAME, Manifest
from shardtok.format.shard_reader import ShardReader, ShardStreamReader

STREAM_BUFFER = 1 << 20
PREFETCH_DEPTH = 8  # first blocks of the next shard group kept ready (2 groups of 4)


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _local_path(location: str) -> Path:
    return Path(location[len("file://") :] if location.startswith("file://") else location)


def _storage():
    try:
        from shardtok import storage
    except ImportError as exc:  # pragma: no cover - the package ships with shardtok
        raise StorageError("shardtok.storage", None, f"cannot import: {exc}") from None
    if not hasattr(storage, "open_source"):
        raise StorageError(
            "shardtok.storage", None, "this build has no object storage support (open_source)"
        )
    return storage


class DatasetSource:
    """A dataset location; picklable (it holds plain data only), so it travels to workers.

    Remote options: `storage_options` for the fsspec backend (endpoint, credentials, ...),
    `retry` (a shardtok.storage.RetryPolicy), and `cache_dir`/`cache_bytes` for an optional
    shared local cache of whole shards. Each process builds its own prefetcher and cache handle.
    """

    def __init__(
        self,
        location: str | Path,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: Any = None,
        cache_dir: str | Path | None = None,
        cache_bytes: int | None = None,
    ):
        self.location = str(location).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.cache_bytes = cache_bytes
        if self.cache_dir is not None and not cache_bytes:
            raise ValueError("cache_dir needs cache_bytes, the cache's size limit")
        self._manifest: Manifest | None = None
        self._prefetcher: Any = None

    def __getstate__(self) -> dict:
        return {
            "location": self.location,
            "storage_options": self.storage_options,
            "retry": self.retry,
            "cache_dir": self.cache_dir,
            "cache_bytes": self.cache_bytes,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._manifest = None
        self._prefetcher = None

    def _remote(self):
        """The process's prefetcher: opens remote shards, starting on the next ones early."""
        if self._prefetcher is None:
            storage = _storage()
            cache = None
            if self.cache_dir is not None:
                cache = storage.LocalCache(self.cache_dir, self.cache_bytes)
            self._prefetcher = storage.Prefetcher(
                self.storage_options or None, self.retry, cache, depth=PREFETCH_DEPTH
            )
        return self._prefetcher

    def prefetch(self, names: list[str]) -> None:
        """Start fetching the first block of each shard in `names` (remote datasets only)."""
        if self.is_local:
            return
        for name in names:
            self._remote().prefetch(self.path_of(name))

    @property
    def is_local(self) -> bool:
        return _is_local(self.location)

    def path_of(self, name: str) -> str:
        if self.is_local:
            return str(_local_path(self.location) / name)
        return _storage().join_url(self.location, name)

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            where = self.path_of(MANIFEST_NAME)
            if self.is_local:
                try:
                    data = Path(where).read_bytes()
                except FileNotFoundError:
                    raise CorruptShardError(
                        where, None, None, "no dataset manifest here (is this a shardtok dataset?)"
                    ) from None
            else:
                data = _storage().read_bytes(where, self.storage_options or None, self.retry)
            self._manifest = Manifest.from_bytes(data, where)
        return self._manifest

    def open_stream(self, name: str) -> tuple[ShardStreamReader, Any]:
        """A sequential reader of shard `name` and the file object to close when done."""
        where = self.path_of(name)
        if self.is_local:
            try:
                fileobj = open(where, "rb", buffering=STREAM_BUFFER)  # noqa: SIM115 - caller closes
            except FileNotFoundError:
                raise CorruptShardError(
                    where, None, None, "shard listed in the manifest is missing"
                ) from None
        else:
            fileobj = self._remote().open_stream(where)
        try:
            return ShardStreamReader(fileobj, where), fileobj
        except BaseException:
            fileobj.close()
            raise

    def open_random(self, name: str) -> ShardReader:
        """A random-access reader of shard `name` (range reads)."""
        where = self.path_of(name)
        if self.is_local:
            if not Path(where).exists():
                raise CorruptShardError(
                    where, None, None, "shard listed in the manifest is missing"
                )
            return ShardReader(where)
        return ShardReader(self._remote().source(where), where)
