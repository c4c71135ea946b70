"""`index.json`: the dataset manifest. Planning (epoch plans, equal work per rank) reads only this.

``Manifest.write`` also writes its compact form, ``index.compact`` (``compact_manifest``), which
a worker reads by byte range instead of parsing every shard's entry; a manifest read from it has
a lazy ``ShardTable`` as ``shards``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from shardtok._threads import beside
from shardtok.errors import CorruptShardError
from shardtok.format.compact_manifest import (
    COMPACT_NAME,
    FIELDS_AT,
    HEADER_DIGEST_KEY,
    ShardTable,
)
from shardtok.format.compact_writer import CompactDraft
from shardtok.format.shard_entry import ShardEntry
from shardtok.format.shard_groups import group_count, group_sums
from shardtok.format.validate import (
    want_dict,
    want_int,
    want_sha256,
    want_str,
    want_token_fields,
)

MANIFEST_NAME = "index.json"
DATASET_FORMAT = "shardtok-dataset"
DATASET_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Manifest:
    name: str
    dtype: np.dtype
    vocab_size: int
    tokenizer: dict
    # A tuple from index.json; a ShardTable (rows read on demand) from index.compact.
    shards: Sequence[ShardEntry]
    extra: dict = field(default_factory=dict)
    # The SFT settings the writer's caller gave (free-form); None for datasets without masks.
    sft: dict | None = None
    # index.json's record of the index.compact written with it (``Manifest.files`` sets it):
    # kept so that to_bytes gives the file's bytes back, not part of what the manifest says.
    compact_header_sha256: str | None = field(default=None, compare=False)

    @property
    def masked(self) -> bool:
        return self.sft is not None

    def _sum(self, key: str) -> int:
        known = getattr(self.shards, "sums", None)  # a ShardTable's header has the totals
        if known is not None:
            return known[key]
        return sum(getattr(s, key) for s in self.shards)

    @property
    def trained_tokens(self) -> int | None:
        return self._sum("trained_tokens") if self.masked else None

    @property
    def num_documents(self) -> int:
        return self._sum("num_documents")

    @property
    def num_tokens(self) -> int:
        return self._sum("num_tokens")

    @property
    def num_bytes(self) -> int:
        return self._sum("bytes")

    @property
    def sha256(self) -> str:
        """The sha256 of index.json (this manifest's canonical bytes): what names the dataset in
        resume fingerprints. A compact manifest records it, so no row is read for it."""
        known = getattr(self.shards, "index_sha256", None)
        return known if known is not None else hashlib.sha256(self.to_bytes()).hexdigest()

    def group_tokens(self) -> np.ndarray:
        """Tokens per shard group (``shard_groups``), what the epoch plan permutes."""
        known = getattr(self.shards, "group_tokens", None)
        if known is not None:
            return known
        n = len(self.shards)
        tokens = np.fromiter((s.num_tokens for s in self.shards), dtype=np.int64, count=n)
        return group_sums(tokens, group_count(n))

    def file_of(self, i: int) -> str:
        """Shard i's file name (a compact manifest's pattern gives it without a read)."""
        table = self.shards
        return table.file(i) if isinstance(table, ShardTable) else table[i].file

    @property
    def tokenizer_fingerprint(self) -> str | None:
        return self.tokenizer.get("fingerprint")

    def to_bytes(self) -> bytes:
        doc = {
            "dtype": self.dtype.name,
            "extra": self.extra,
            "format": DATASET_FORMAT,
            "format_version": DATASET_FORMAT_VERSION,
            "name": self.name,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "shards": [s.to_json() for s in self.shards],
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
        }
        if self.masked:
            doc["sft"] = self.sft
            doc["trained_tokens"] = self.trained_tokens
        if self.compact_header_sha256 is not None:
            doc[HEADER_DIGEST_KEY] = self.compact_header_sha256  # sorts first: a worker reads it
        return (json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        def fail(reason: str) -> CorruptShardError:
            return CorruptShardError(where, None, None, reason)

        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise fail(f"manifest is not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != DATASET_FORMAT:
            raise fail("not a shardtok dataset manifest")
        if doc.get("format_version") != DATASET_FORMAT_VERSION:
            raise fail(
                f"manifest version {doc.get('format_version')} is not supported (reads {DATASET_FORMAT_VERSION})"
            )
        shards_doc = doc.get("shards")
        if not isinstance(shards_doc, list):
            raise fail(f"field 'shards' is {shards_doc!r}, not a list")
        shards = tuple(ShardEntry.from_json(s, fail) for s in shards_doc)
        dtype, vocab_size = want_token_fields(doc, fail)
        manifest = cls(
            name=want_str(doc, "name", fail),
            dtype=dtype,
            vocab_size=vocab_size,
            tokenizer=want_dict(doc, "tokenizer", fail),
            shards=shards,
            extra=want_dict(doc, "extra", fail),
            sft=want_dict(doc, "sft", fail) if "sft" in doc else None,
            compact_header_sha256=(
                want_sha256(doc, HEADER_DIGEST_KEY, fail) if HEADER_DIGEST_KEY in doc else None
            ),
        )
        # A dataset is masked as a whole: the sft dict and every shard's count, or none of them.
        counted = {s.trained_tokens is not None for s in shards}
        if counted - {manifest.masked}:
            raise fail("sft and the shards' trained_tokens must be all present or all absent")
        if "trained_tokens" in doc and not manifest.masked:
            raise fail("trained_tokens without sft")
        for key, value in (
            ("num_documents", manifest.num_documents),
            ("num_tokens", manifest.num_tokens),
            ("trained_tokens", manifest.trained_tokens),
        ):
            if key in doc and want_int(doc, key, fail) != value:
                raise fail(f"{key} is {doc[key]} but the shards add up to {value}")
        if len({s.file for s in shards}) != len(shards):
            raise fail("a shard is listed twice")
        for own in (MANIFEST_NAME, COMPACT_NAME):
            if own in {s.file for s in shards}:
                raise fail(f"{own} is listed as a shard")
        return manifest

    def files(self) -> list[tuple[str, bytes]]:
        """What a dataset folder gets, in the order to publish it: index.compact, then
        index.json last (a folder with an index.json is complete). index.json records the
        compact header's digest and the compact header index.json's sha256 (``CompactDraft``
        leaves each out of the other's digest)."""
        draft = CompactDraft(self)
        data = replace(self, compact_header_sha256=draft.digest).to_bytes()
        return [(COMPACT_NAME, draft.finish(data)), (MANIFEST_NAME, data)]

    def write(self, folder: str | Path) -> Path:
        """Write both manifests atomically (readers never see a half-written one), index.json
        last; returns index.json's path. Both are written and fsynced before either is moved
        into place, the two fsyncs at once (one journal commit instead of two in a row: 1-3
        ms at the end of every convert)."""
        placed = []
        try:
            for name, data in self.files():
                path = Path(folder) / name
                tmp = path.with_name(f".{name}.tmp-{os.getpid()}")
                placed.append((tmp, path))
                with open(tmp, "wb") as out:
                    out.write(data)
            (first, _), (second, _) = placed
            with beside("shardtok-fsync", functools.partial(_fsync, first)):
                _fsync(second)
            for tmp, path in placed:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in placed:
                tmp.unlink(missing_ok=True)
            raise
        return placed[-1][1]

    @classmethod
    def from_compact(cls, table: ShardTable) -> Manifest:
        """The manifest of a compact manifest's header (rows stay unread until used)."""
        h = table.header

        def fail(reason: str) -> CorruptShardError:
            return h.fail(FIELDS_AT, f"dataset fields: {reason}")

        doc = h.meta
        dtype, vocab_size = want_token_fields(doc, fail)
        masked = "sft" in doc
        if masked != (h.trained_tokens is not None):
            raise fail("sft and the trained_tokens column must be both present or both absent")
        return cls(
            name=want_str(doc, "name", fail),
            dtype=dtype,
            vocab_size=vocab_size,
            tokenizer=want_dict(doc, "tokenizer", fail),
            shards=table,
            extra=want_dict(doc, "extra", fail),
            sft=want_dict(doc, "sft", fail) if masked else None,
            # What the index.json written with it records (0.3's records none): so to_bytes
            # gives that index.json's bytes.
            compact_header_sha256=h.digest if h.rows_sha256 is not None else None,
        )


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptShardError(
            str(path), None, None, "no dataset manifest here (is this a shardtok dataset folder?)"
        ) from None
    return Manifest.from_bytes(data, str(path))
