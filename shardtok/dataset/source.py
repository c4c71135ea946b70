"""``DatasetSource``: one dataset (or a subset of its shards) at any location, where every
reader of a dataset gets its manifest and its shards' bytes.

A dataset is a folder or URL prefix holding ``index.json`` and the shards; a source may stream
a subset of them (``shards``: named by a list, a brace pattern or a glob, see
``shardtok.dataset.shard_names``). The location is parsed once (``Location``: local path, ``file://``, or a remote URL) and every file is opened
through ``open_source``, so local and remote datasets take the same path; local files are
still read with plain OS files and ``os.pread``, because that is what ``open_source`` gives
for them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from shardtok.dataset.manifest_files import ManifestFiles, missing
from shardtok.dataset.shard_names import check_shard_name, select_shards
from shardtok.errors import CorruptShardError, UsageError
from shardtok.format.compact_manifest import ShardTable
from shardtok.format.identity import check_shard_identity
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardtok.format.shard_reader import ShardReader, ShardStreamReader
from shardtok.storage.base import ByteSource, ObjectNotFoundError
from shardtok.storage.cache import LocalCache
from shardtok.storage.endpoints import endpoint_of, note_reached, was_reached
from shardtok.storage.location import Location, LocationError
from shardtok.storage.prefetch import Prefetcher

PREFETCH_DEPTH = 8  # first blocks of the next shard group kept ready (2 groups of 4)


class DatasetSource:
    """A dataset location; picklable (it holds plain data only), so it travels to workers.

    Remote options: `storage_options` for the fsspec backend (endpoint, credentials, ...),
    `retry` (a shardtok.storage.RetryPolicy), and `cache_dir`/`cache_bytes` for an optional
    shared local cache of whole shards. Each process builds its own prefetcher and cache handle.

    `shards`: file names of some of the dataset's shards (None: all). ``manifest`` is then the
    subset's view of ``index.json``: its entries for those shards, in index.json's order
    (whatever order they were given in, so a subset always plans the same), and the counts
    they add up to; ``dataset_manifest`` is index.json whole. ``DatasetSource.of`` reads a
    location, pattern, glob or list into a source.

    A local dataset's files (manifests, shards) must resolve inside its folder: a symbolic link
    to a file elsewhere is refused with a ``LocationError`` before it is opened, unless
    `allow_symlinks_outside` (links within the folder, and a folder that is itself a link, are
    always followed).
    """

    def __init__(
        self,
        location: str | Path | Location,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: Any = None,
        cache_dir: str | Path | None = None,
        cache_bytes: int | None = None,
        shards: Sequence[str] | None = None,
        allow_symlinks_outside: bool = False,
    ):
        # `location` is kept as given (less trailing slashes): resume fingerprints record it.
        self.location = str(Location.of(location).url).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.cache_bytes = cache_bytes
        if self.cache_dir is not None and not cache_bytes:
            raise ValueError("cache_dir needs cache_bytes, the cache's size limit")
        self.allow_symlinks_outside = bool(allow_symlinks_outside)
        self.root = self._root()
        self.shards = None if shards is None else _shard_names(shards, self.root)
        self._reset()

    def _reset(self) -> None:
        self._manifest: Manifest | None = None  # index.json as read
        self._view: Manifest | None = None  # the subset's entries (index.json without a subset)
        self._positions: tuple[int, ...] | None = None
        self._entries: dict[str, ShardEntry] | None = None
        self._prefetcher: Prefetcher | None = None
        self._sizes: dict[str, np.ndarray] = {}

    def _root(self) -> Location:
        root = Location(self.location)
        if root.is_local and not self.allow_symlinks_outside:
            return _Confined(root.url)
        return root

    @classmethod
    def of(
        cls,
        what: str | Path | Sequence[str | Path],
        storage_options: dict[str, Any] | None = None,
        *,
        base: Path | None = None,
        **kwargs: Any,
    ) -> DatasetSource:
        """The source `what` names: a dataset folder or URL prefix, or some of its shards (a
        ``.tar`` file or URL, a brace pattern, a local glob, or a list of those; see
        ``shard_names.select_shards``). `base`: the folder relative local paths are read from.
        `kwargs` go to the constructor (``retry``, ``cache_dir``, ``cache_bytes``,
        ``allow_symlinks_outside``)."""
        chosen = select_shards(what, base=base)
        return cls(chosen.root, storage_options, shards=chosen.shards, **kwargs)

    def __getstate__(self) -> dict:
        state = {
            "location": self.location,
            "storage_options": self.storage_options,
            "retry": self.retry,
            "cache_dir": self.cache_dir,
            "cache_bytes": self.cache_bytes,
        }
        if self.shards is not None:
            state["shards"] = self.shards
        if self.allow_symlinks_outside:  # absent otherwise: states saved before it still load
            state["allow_symlinks_outside"] = True
        # A spawned worker starts with no endpoint reached: without this, a server restarting
        # just as it starts would be taken for a wrong port and fail the run (endpoints).
        if not self.is_local and was_reached(self._endpoint()):
            state["reached"] = True
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        reached = state.pop("reached", False)
        self.__dict__.update({"shards": None, "allow_symlinks_outside": False, **state})
        self.root = self._root()
        self._reset()
        if reached:
            note_reached(self._endpoint())

    def _endpoint(self):
        return endpoint_of(self.location, self.storage_options)

    @property
    def key(self) -> str | tuple[str, frozenset[str]]:
        """What tells sources apart without reading anything: the location, and the subset's
        names when there is one (two subsets of one dataset are two sources)."""
        return self.location if self.shards is None else (self.location, frozenset(self.shards))

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
        """The location as messages and outputs print it (no credentials, no query values); a
        subset's shards (sorted, the first and last of more than three) in brackets after it."""
        if self.shards is None:
            return self.root.display
        names = sorted(self.shards)
        if len(names) > 3:
            names = [names[0], "...", names[-1], f"{len(names):,} shards"]
        return f"{self.root.display}[{', '.join(names)}]"

    def path_of(self, name: str) -> str:
        """The OS path of a local shard, or its URL (credentials included: open, never print).

        Every file name goes through ``Location.join``, which refuses anything but a plain
        file name, so nothing outside the dataset's folder or origin is ever opened."""
        return str(self.root.join(name))

    def where_of(self, name: str) -> str:
        """How to name file `name` in messages (a URL without credentials)."""
        # Naming a file reads nothing: a link out of the folder is refused where it is opened.
        return Location.join(self.root, name).display

    def open_file(self, name: str) -> ByteSource:
        """File `name` of the dataset as a ``ByteSource``; nothing is read yet."""
        return self._opener().source(self.path_of(name))

    def _missing(self, where: str, exc: ObjectNotFoundError, what: str) -> Exception:
        return missing(where, exc, what, self.is_local)

    @property
    def _files(self) -> ManifestFiles:
        return ManifestFiles(self.root, self.storage_options or None, self.retry, self.is_local)

    @property
    def dataset_manifest(self) -> Manifest:
        """The dataset's manifest, every shard (what identifies the dataset): from
        ``index.compact`` when the dataset has one (its header now, rows as they are needed),
        else ``index.json`` whole."""
        if self._manifest is None:
            files = self._files
            self._manifest = files.compact_manifest()
            if self._manifest is None:
                data = files.json_bytes()
                self._json_size = len(data)
                self._manifest = files.json_manifest(data)
        return self._manifest

    def verified_manifest(self, on_problem: Callable[[str], None] | None = None) -> Manifest:
        """What ``manifest`` gives, from index.json read whole, after checking that the
        dataset's index.compact (if any) agrees with it; the source then streams from
        index.json. For ``verify``, which must not trust either (``ManifestFiles.verified``:
        with `on_problem`, index.compact's problems are reported there, not raised)."""
        full = self._files.verified(on_problem)
        self._reset()
        self._manifest = full
        return self.manifest

    def manifests(self) -> dict:
        """Which manifests the dataset has, their sizes, and whether they agree (inspect)."""
        return self._files.summary()

    @property
    def manifest_bytes_read(self) -> int:
        """Bytes of manifest read so far in this process (what starting a job costs)."""
        table = self.dataset_manifest.shards
        if isinstance(table, ShardTable):
            return table.bytes_read
        return getattr(self, "_json_size", 0)

    @property
    def manifest(self) -> Manifest:
        """What is streamed: ``index.json``, or with `shards` its view of the subset (class
        docstring). Planning, lengths, previews and traces all read this."""
        if self._view is None:
            full = self.dataset_manifest
            if self.shards is None:
                self._view = full
            else:
                self._positions = _subset_positions(full, self.shards, self)
                entries = [full.shards[i] for i in self._positions]
                self._view = replace(full, shards=tuple(entries))
        return self._view

    @property
    def subset_positions(self) -> tuple[int, ...] | None:
        """Where the subset's shards sit in ``index.json`` (ascending); None without a subset."""
        if self.shards is None:
            return None
        if self._positions is None:
            view = self.manifest  # sets the positions with the view it makes
            if self._positions is None:  # a view given from outside (AddressSource's)
                names = tuple(e.file for e in view.shards)
                self._positions = _subset_positions(self.dataset_manifest, names, self)
        return self._positions

    def entry(self, name: str) -> ShardEntry:
        """The manifest's entry for shard file `name`."""
        table = self.manifest.shards
        if isinstance(table, ShardTable):  # the whole dataset from index.compact: no dict
            position = table.position_of(name)
            if position is not None:
                return table[position]
        else:
            if self._entries is None:
                self._entries = {e.file: e for e in table}
            if name in self._entries:
                return self._entries[name]
        what = f"not a shard {MANIFEST_NAME} lists"
        if self.shards is not None:
            what = f"not one of the {len(self.shards):,} shards of this subset"
        raise CorruptShardError(self.where_of(name), None, None, what)

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


@dataclass(frozen=True)
class _Confined(Location):
    """A local dataset folder whose joined names must resolve inside it (``DatasetSource``):
    every file of the dataset, manifests included, is opened through ``join``."""

    @cached_property
    def _real(self) -> str:
        return os.path.realpath(self.local_path)

    def join(self, name: str) -> Location:
        target = super().join(name)
        resolved = os.path.realpath(target.local_path)
        if os.path.commonpath([self._real, resolved]) != self._real:
            # Only the link's target is named, never anything read from it.
            raise LocationError(
                target.display,
                None,
                f"a symbolic link to {resolved}, outside the dataset's folder {self._real}: "
                "refused without reading it (DatasetSource(..., allow_symlinks_outside=True) "
                "follows such links)",
            )
        return target


def _shard_names(shards: Sequence[str], root: Location) -> tuple[str, ...]:
    """`shards` checked as a subset's file names: plain ``.tar`` names, each once."""
    if isinstance(shards, (str, bytes)):
        raise UsageError(f"shards must be a list of file names, not the string {shards!r}")
    names = tuple(shards)
    if not names:
        raise UsageError(f"{root.display}: an empty list of shards names no data")
    seen: set[str] = set()
    for name in names:
        check_shard_name(name, name)  # the rule a list or pattern is read with
        if name in seen:
            raise UsageError(f"{root.display}: shard {name} is named twice")
        seen.add(name)
    return names


def _subset_positions(
    full: Manifest, shards: tuple[str, ...], source: DatasetSource
) -> tuple[int, ...]:
    """Where the entries of `shards` sit in the manifest, ascending (index.json's order)."""
    table = full.shards
    if isinstance(table, ShardTable):
        found = {name: table.position_of(name) for name in shards}
        if all(p is not None for p in found.values()):  # the rows the view needs, in few reads
            table.load_groups({p % table.header.groups for p in found.values()})  # type: ignore[operator]
    else:
        index = {e.file: i for i, e in enumerate(table)}
        found = {name: index.get(name) for name in shards}
    for name in shards:
        if found[name] is None:
            count = f"{len(table):,} shard" + ("" if len(table) == 1 else "s")
            raise UsageError(
                f"{source.where_of(name)}: not a shard of the dataset: "
                f"{source.where_of(MANIFEST_NAME)} lists {count}, not this one"
            )
    return tuple(sorted(found.values()))  # type: ignore[type-var]
