"""A dataset's two manifests: ``index.json`` read whole, ``index.compact`` read by range, and the
rule that ties them (the compact one is trusted only beside the index.json it was written with,
which records its header's digest).

``DatasetSource`` asks here for the manifest it streams from; ``verify`` and ``inspect`` ask
whether the two agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from shardtok.errors import CorruptShardError
from shardtok.format.compact_manifest import (
    COMPACT_NAME,
    FIRST_READ,
    HEADER_DIGEST_KEY,
    INDEX_HEAD,
    INDEX_SIZE_AT,
    ShardTable,
    differences,
    index_head_digest,
)
from shardtok.format.manifest import MANIFEST_NAME, Manifest
from shardtok.storage.base import AccessDeniedError, ByteSource, ObjectNotFoundError
from shardtok.storage.location import Location
from shardtok.storage.source import open_source, read_bytes

NO_MANIFEST = "no dataset manifest here (is this a shardtok dataset folder?)"


def missing(where: str, exc: ObjectNotFoundError, what: str, is_local: bool) -> Exception:
    """A file of the dataset that is not there. A local folder without its files is a damaged
    dataset, reported as such; a remote 404 keeps its storage error, which names the URL
    safely."""
    return CorruptShardError(where, None, None, what) if is_local else exc


class ManifestFiles:
    """``index.json`` and ``index.compact`` under `root` (nothing is read until asked)."""

    def __init__(self, root: Location, storage_options: dict | None, retry: Any, is_local: bool):
        self.root, self.options, self.retry, self.is_local = root, storage_options, retry, is_local

    def json_bytes(self) -> bytes:
        target = self.root.join(MANIFEST_NAME)
        try:
            return read_bytes(target, self.options, self.retry)
        except ObjectNotFoundError as exc:
            raise missing(target.display, exc, NO_MANIFEST, self.is_local) from None

    def json_manifest(self, data: bytes) -> Manifest:
        return Manifest.from_bytes(data, self.root.join(MANIFEST_NAME).display)

    def compact_table(self) -> ShardTable | None:
        """``index.compact`` opened (its header read and checked), None without one."""
        ranges = _Ranges(self.root.join(COMPACT_NAME), self.options, self.retry)
        try:
            size = ranges.size
        except ObjectNotFoundError:
            return None
        except AccessDeniedError:
            # S3 answers 403 for a missing key to a reader without s3:ListBucket (CDNs in front
            # of it too): a dataset of an earlier release has no index.compact. index.json is
            # read next, so a store that refuses everything is still named there.
            if self.is_local:
                raise
            return None
        return ShardTable(ranges, size, ranges.target.display)

    def compact_manifest(self) -> Manifest | None:
        """The manifest of ``index.compact``, None without one. It is trusted only beside the
        index.json it was written with: that file must exist with the size its header records,
        and when index.json's first line records a compact header digest (datasets written
        after 0.3.0), the header must be that one: index.json's first 256 bytes, in the request
        that tells its size (``shardtok verify`` and ``inspect`` compare the two in full)."""
        table = self.compact_table()
        if table is None:
            return None
        index = self.root.join(MANIFEST_NAME)
        try:
            # A remote size is a GET of the head: asking for no more than the digest line
            # costs what the HEAD did, and the read below is served from it.
            with open_source(index, self.options, self.retry, block_size=INDEX_HEAD) as source:
                index_size = source.size
                head = source.read_range(0, min(index_size, INDEX_HEAD))
        except ObjectNotFoundError as exc:
            raise missing(index.display, exc, NO_MANIFEST, self.is_local) from None
        h = table.header

        def not_one_write(offset: int, what: str) -> CorruptShardError:
            return h.fail(
                offset,
                f"{what}: the two manifests are not of one write (delete {COMPACT_NAME} to "
                f"read {MANIFEST_NAME} alone)",
            )

        if index_size != h.index_size:
            raise not_one_write(
                INDEX_SIZE_AT,
                f"written with an index.json of {h.index_size:,} bytes, but {index.display} is "
                f"{index_size:,} bytes",
            )
        recorded = index_head_digest(head)
        if recorded is not None and recorded != h.digest:
            raise not_one_write(0, f"{index.display} records another {COMPACT_NAME} header")
        if recorded is None and h.rows_sha256 is not None:
            # A header of this release beside an index.json that records none: the size
            # matched, but nothing ties this header's shard list to index.json's.
            raise not_one_write(0, f"{index.display} records no {HEADER_DIGEST_KEY}")
        return Manifest.from_compact(table)

    def verified(self, on_problem: Callable[[str], None] | None = None) -> Manifest:
        """index.json's manifest, after checking that index.compact (if any) agrees with it
        field by field and row by row (both read whole). A damaged or disagreeing index.compact
        raises (one line), or with `on_problem` is reported there and index.json still given."""
        data = self.json_bytes()
        full = self.json_manifest(data)
        try:
            table = self.compact_table()
            problems = [] if table is None else differences(full, data, table)
            if problems:
                raise CorruptShardError(
                    table.where, None, None,  # type: ignore[union-attr]
                    f"does not agree with {MANIFEST_NAME}: {'; '.join(problems)} (write the "
                    f"dataset again, or delete {COMPACT_NAME} to read {MANIFEST_NAME} alone)",
                )  # fmt: skip
        except CorruptShardError as exc:
            if on_problem is None:
                raise
            on_problem(str(exc))
        return full

    def summary(self) -> dict:
        """Which manifests there are, their sizes, and whether index.compact agrees with
        index.json (both read whole): what ``shardtok inspect`` shows."""
        data = self.json_bytes()
        out: dict = {MANIFEST_NAME: {"bytes": len(data)}}
        table = self.compact_table()
        if table is None:
            out[COMPACT_NAME] = None
            return out
        problems = differences(self.json_manifest(data), data, table)
        size = table.header.records_at + len(table) * table.header.dtype.itemsize
        size += 4 * table.header.groups
        out[COMPACT_NAME] = {"bytes": size, "agrees": not problems, "differences": problems}
        return out


class _Ranges:
    """Range reads of one file for a ``ShardTable``, through the storage layer. The source is
    opened on first use and again in a forked child (a parent's connection is not its own)."""

    def __init__(self, target: Location, storage_options: dict | None, retry: Any):
        self.target, self._options, self._retry = target, storage_options, retry
        self._source: ByteSource | None = None
        self._pid = 0

    def _open(self) -> ByteSource:
        if self._source is None or self._pid != os.getpid():
            # The first GET of a remote object also reads its head: only what the table's
            # first read takes, not a stream's first MiB (twice the manifest a worker needs).
            self._source = open_source(
                self.target, self._options, self._retry, block_size=FIRST_READ
            )
            self._pid = os.getpid()
        return self._source

    @property
    def size(self) -> int:
        return self._open().size

    def __call__(self, offset: int, length: int) -> bytes:
        return self._open().read_range(offset, length)
