"""Full integrity check of shards and datasets: every checksum, frame and index invariant.

Callers open the bytes (``open_stream`` callables; ``shardtok verify`` builds them with
``shardtok.storage``): this layer checks a shard wherever it lives without deciding how to
reach it. Opening happens inside the check, so a file that cannot be read is reported for that
shard instead of stopping the run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardtok.errors import CorruptShardError, StorageError
from shardtok.format.identity import check_shard_identity
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardtok.format.shard_reader import ShardStreamReader

# Opens a binary stream of one shard from its first byte (closed by the check).
OpenStream = Callable[[], Any]


class _HashingReader:
    """Hashes every byte the stream reader consumes, so one pass checks the file sha256 too."""

    def __init__(self, raw):
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def read(self, n: int) -> bytes:
        data = self._raw.read(n)
        self.sha256.update(data)
        self.nbytes += len(data)
        return data

    def drain(self) -> None:
        while self.read(8 << 20):
            pass


@dataclass
class ShardReport:
    file: str
    ok: bool
    error: str | None = None
    num_documents: int = 0
    num_tokens: int = 0


@dataclass
class VerifyReport:
    shards: list[ShardReport] = field(default_factory=list)
    errors: list[str] = field(
        default_factory=list
    )  # dataset-level problems (manifest, missing files)

    @property
    def ok(self) -> bool:
        return not self.errors and all(s.ok for s in self.shards)

    @property
    def bad_shards(self) -> list[ShardReport]:
        return [s for s in self.shards if not s.ok]


def verify_shard(
    open_stream: OpenStream,
    where: str,
    entry: ShardEntry | None = None,
    manifest: Manifest | None = None,
) -> ShardReport:
    """Decode every frame and compare every checksum; with `entry`, also the manifest's claims,
    and with `manifest` too, every dataset-wide field (dtype, vocabulary, tokenizer).

    `where` names the shard in messages (a path, or a URL without credentials)."""
    report = ShardReport(where.rstrip("/").rsplit("/", 1)[-1], ok=False)
    try:
        with open_stream() as raw:
            stream = _HashingReader(raw)
            reader = ShardStreamReader(stream, where, full_checks=True)
            # The head's claims first: what a frame may decode to is bounded by counts the
            # manifest agrees with, never by what a foreign shard's own frame table declares.
            if entry is not None:
                _check_entry(where, entry, reader, stream, declared_only=True)
                if manifest is not None:
                    check_shard_identity(reader.meta, entry, manifest, where)
            for _ in reader.documents():
                pass
            stream.drain()  # trailing bytes (none in shards we write) still count towards the file hash
        report.num_documents, report.num_tokens = reader.meta.num_documents, reader.meta.num_tokens
        if entry is not None:
            _check_entry(where, entry, reader, stream)
            if manifest is not None:
                check_shard_identity(reader.meta, entry, manifest, where, stream.nbytes)
    except CorruptShardError as exc:
        report.error = str(exc)
        return report
    except (OSError, StorageError) as exc:
        if isinstance(exc, StorageError) and not getattr(exc, "strerror", None):
            report.error = str(exc)  # a remote read that failed for good: names URL and offset
        else:
            report.error = f"{where}: cannot read ({exc.strerror or exc})"
        return report
    report.ok = True
    return report


def _check_entry(
    where: str,
    entry: ShardEntry,
    reader: ShardStreamReader,
    stream: _HashingReader,
    declared_only: bool = False,
) -> None:
    """The manifest's claims against the shard: with `declared_only`, the counts its head
    declares (before any frame is decoded); otherwise also the file's size and sha256."""
    claims = (
        ("document count", entry.num_documents, reader.meta.num_documents),
        ("token count", entry.num_tokens, reader.meta.num_tokens),
    )
    if not declared_only:
        claims = (
            ("byte size", entry.bytes, stream.nbytes),
            *claims,
            ("sha256", entry.sha256, stream.sha256.hexdigest()),
        )
    for what, manifest_says, shard_has in claims:
        if manifest_says != shard_has:
            raise CorruptShardError(
                where,
                None,
                None,
                f"manifest {MANIFEST_NAME} says {what} {manifest_says}, the shard has {shard_has}",
            )


def verify_dataset(
    load_manifest: Callable[[], Manifest],
    open_shard: Callable[[str], OpenStream],
    where_of: Callable[[str], str],
) -> VerifyReport:
    """Verify every shard the manifest lists: `open_shard(file)` gives the shard's opener and
    `where_of(file)` its name in messages."""
    report = VerifyReport()
    try:
        manifest = load_manifest()
    except CorruptShardError as exc:
        report.errors.append(str(exc))
        return report
    for entry in manifest.shards:
        shard_report = verify_shard(open_shard(entry.file), where_of(entry.file), entry, manifest)
        report.shards.append(shard_report)
    return report
