"""Where the stream gets its bytes: one small seam between the stream and storage.

A dataset is a folder or URL prefix holding ``index.json`` and the shards. The location is
parsed once (``Location``: local path, ``file://``, or a remote URL) and every file is opened
through ``open_source``, so local and remote datasets take the same path; local files are
still read with plain OS files and ``os.pread``, because that is what ``open_source`` gives
for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.identity import check_shard_identity
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardtok.format.shard_reader import ShardReader, ShardStreamReader
from shardtok.storage.base import ByteSource, ObjectNotFoundError
from shardtok.storage.cache import LocalCache
from shardtok.storage.location import Location
from shardtok.storage.prefetch import Prefetcher
from shardtok.storage.source import read_bytes

PREFETCH_DEPTH = 8  # first blocks of the next shard group kept ready (2 groups of 4)


class DatasetSource:
    """A dataset location; picklable (it holds plain data only), so it travels to workers.

    Remote options: `storage_options` for the fsspec backend (endpoint, credentials, ...),
    `retry` (a shardtok.storage.RetryPolicy), and `cache_dir`/`cache_bytes` for an optional
    shared local cache of whole shards. Each process builds its own prefetcher and cache handle.
    """

    def __init__(
        self,
        location: str | Path | Location,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: Any = None,
        cache_dir: str | Path | None = None,
        cache_bytes: int | None = None,
    ):
        # `location` is kept as given (less trailing slashes): resume fingerprints record it.
        self.location = str(Location.of(location).url).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.cache_bytes = cache_bytes
        if self.cache_dir is not None and not cache_bytes:
            raise ValueError("cache_dir needs cache_bytes, the cache's size limit")
        self.root = Location(self.location)
        self._manifest: Manifest | None = None
        self._entries: dict[str, ShardEntry] | None = None
        self._prefetcher: Prefetcher | None = None
        self._sizes: dict[str, np.ndarray] = {}

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
        self.root = Location(self.location)
        self._manifest = None
        self._entries = None
        self._prefetcher = None
        self._sizes = {}

    def _opener(self) -> Prefetcher:
        """The process's prefetcher: opens shards, starting on the next remote ones early."""
        if self._prefetcher is None:
            cache = None
            if self.cache_dir is not None:
                cache = LocalCache(self.cache_dir, self.cache_bytes)
            self._prefetcher = Prefetcher(
                self.storage_options or None, self.retry, cache, depth=PREFETCH_DEPTH
            )
        return self._prefetcher

    def prefetch(self, names: list[str]) -> None:
        """Start fetching the first block of each shard in `names` (remote datasets only:
        the page cache already serves local files well, and a hint would hold descriptors)."""
        if self.is_local:
            return
        for name in names:
            self._opener().prefetch(self.path_of(name))

    @property
    def is_local(self) -> bool:
        return self.root.is_local

    @property
    def display(self) -> str:
        """The location as messages and outputs print it (no credentials, no query values)."""
        return self.root.display

    def path_of(self, name: str) -> str:
        """The OS path of a local shard, or its URL (credentials included: open, never print).

        Every file name goes through ``Location.join``, which refuses anything but a plain
        file name, so nothing outside the dataset's folder or origin is ever opened."""
        return str(self.root.join(name))

    def where_of(self, name: str) -> str:
        """How to name file `name` in messages (a URL without credentials)."""
        return self.root.join(name).display

    def open_file(self, name: str) -> ByteSource:
        """File `name` of the dataset as a ``ByteSource``; nothing is read yet."""
        return self._opener().source(self.path_of(name))

    def _missing(self, where: str, exc: ObjectNotFoundError, what: str) -> Exception:
        # A local folder without its files is a damaged dataset, reported as before; a remote
        # 404 keeps its storage error, which names the URL safely.
        return CorruptShardError(where, None, None, what) if self.is_local else exc

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            target = self.root.join(MANIFEST_NAME)
            where = target.display
            try:
                data = read_bytes(target, self.storage_options or None, self.retry)
            except ObjectNotFoundError as exc:
                what = "no dataset manifest here (is this a shardtok dataset folder?)"
                raise self._missing(where, exc, what) from None
            self._manifest = Manifest.from_bytes(data, where)
        return self._manifest

    def entry(self, name: str) -> ShardEntry:
        """The manifest's entry for shard file `name`."""
        if self._entries is None:
            self._entries = {e.file: e for e in self.manifest.shards}
        try:
            return self._entries[name]
        except KeyError:
            raise CorruptShardError(
                self.where_of(name), None, None, f"not a shard {MANIFEST_NAME} lists"
            ) from None

    def open_stream(self, name: str, *, with_masks: bool = False) -> tuple[ShardStreamReader, Any]:
        """A sequential reader of shard `name` and the file object to close when done.

        `with_masks`: the reader also gets range reads of the same shard (``mask_source``), so
        that ``documents(with_masks=True)`` can fetch mask frame n beside token frame n.

        The shard is checked against its manifest entry before this returns: a shard swapped
        with another or copied in from another dataset is refused before any token is read."""
        entry = self.entry(name)
        target = self.root.join(name)
        where = target.display
        try:
            fileobj = self._opener().open_stream(str(target))
        except ObjectNotFoundError as exc:
            raise self._missing(where, exc, "shard listed in the manifest is missing") from None
        try:
            mask_source = self._opener().source(str(target)) if with_masks else None
            reader = ShardStreamReader(fileobj, where, size=entry.bytes, mask_source=mask_source)
            check_shard_identity(reader.meta, entry, self.manifest, where)
            return reader, fileobj
        except BaseException:
            fileobj.close()
            raise

    def document_sizes(self, name: str) -> np.ndarray:
        """Tokens per document of shard `name`, from its idx (read once per process: a
        range read of the shard's head, checked like any open)."""
        sizes = self._sizes.get(name)
        if sizes is None:
            reader = self.open_random(name)
            sizes = self._sizes[name] = np.asarray(reader.sizes)
            reader.source.close()
        return sizes

    def open_random(self, name: str) -> ShardReader:
        """A random-access reader of shard `name` (range reads), checked as in open_stream."""
        entry = self.entry(name)
        target = self.root.join(name)
        where = target.display
        source = self._opener().source(str(target))
        try:
            size = source.size
        except ObjectNotFoundError as exc:
            raise self._missing(where, exc, "shard listed in the manifest is missing") from None
        reader = ShardReader(source, where)
        check_shard_identity(reader.meta, entry, self.manifest, where, size)
        return reader
