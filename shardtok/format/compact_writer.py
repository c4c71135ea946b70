"""Writing ``index.compact``: its byte layout, the rows packed group-major, and the digests that
bind it to index.json (``header_digest``, ``rows_sha256``). The file's design and the reader are
in ``compact_manifest``; the layout is defined here because the reader depends on the writer's
layout, never the other way round. Byte layout: docs/FORMAT.md ("index.compact").
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections.abc import Sequence

import numpy as np

from shardtok.format.shard_groups import group_count, group_major, group_start, group_sums

MAGIC = b"STKCMAN\x00"
VERSION = 1
FIXED = struct.Struct("<8sIIQIIQQQQ32sQIIQII")  # 128 bytes, docs/FORMAT.md
HEADER_CRC_AT = 124
FLAG_META_SHA256 = 1
FLAG_TRAINED_TOKENS = 2
FLAG_NAMES = 4  # an explicit name per row (names that follow no pattern)
_NUMBERED = re.compile(r"(.*?)(\d+)(\D*)")
# The header bytes that depend on index.json's own bytes (its sha256 and size, and the crc32
# over them): left out of header_digest, which index.json records, or each would hash the other.
UNBOUND = ((64, 104), (HEADER_CRC_AT, HEADER_CRC_AT + 4))


def align8(n: int) -> int:
    return -(-n // 8) * 8


def name_pattern(files: Sequence[str]) -> dict | None:
    """``{"prefix", "first", "width", "suffix"}`` when file i is
    ``f"{prefix}{first + i:0{width}d}{suffix}"`` for every i, else None."""
    if not files:
        return None
    match = _NUMBERED.fullmatch(files[0])
    if match is None:
        return None
    prefix, digits, suffix = match.groups()
    pattern = {"prefix": prefix, "first": int(digits), "width": len(digits), "suffix": suffix}
    if any(f != pattern_name(pattern, i) for i, f in enumerate(files)):
        return None
    return pattern


def pattern_name(pattern: dict, i: int) -> str:
    return f"{pattern['prefix']}{pattern['first'] + i:0{pattern['width']}d}{pattern['suffix']}"


def row_dtype(flags: int, name_width: int) -> np.dtype:
    fields = [("bytes", "<u8"), ("num_documents", "<u8"), ("num_tokens", "<u8")]
    if flags & FLAG_TRAINED_TOKENS:
        fields.append(("trained_tokens", "<u8"))
    fields.append(("sha256", "V32"))
    if flags & FLAG_META_SHA256:
        fields.append(("meta_sha256", "V32"))
    if flags & FLAG_NAMES:
        fields.append(("name", f"S{name_width}"))
    return np.dtype(fields)


def _digests(hexes) -> np.ndarray:
    return np.frombuffer(b"".join(bytes.fromhex(h) for h in hexes), dtype="V32")


def header_digest(head: bytes) -> str:
    """The sha256 index.json records of a compact header (bytes ``[0, R)``), the bytes of
    ``UNBOUND`` taken as zeros."""
    head = bytearray(head)
    for begin, end in UNBOUND:
        head[begin:end] = bytes(end - begin)
    return hashlib.sha256(head).hexdigest()


def rows_digest(records: Sequence[bytes]) -> str:
    """sha256 over the sha256 of each group's rows (``records``, in group order, no crc32): a
    reader that has read every group checks it without keeping the rows' bytes."""
    return rows_digest_of(hashlib.sha256(r).digest() for r in records)


def rows_digest_of(group_digests) -> str:
    return hashlib.sha256(b"".join(group_digests)).hexdigest()


class CompactDraft:
    """A compact manifest before index.json exists: its header, whose ``digest`` index.json
    records, then ``finish`` with index.json's bytes."""

    def __init__(self, manifest):
        shards = list(manifest.shards)
        n = len(shards)
        groups = group_count(n)
        metas = {s.meta_sha256 is not None for s in shards}
        if len(metas) > 1:  # one manifest mixes releases: keep the compact form exact by refusing
            raise ValueError("some shard entries have meta_sha256 and some do not")
        flags = FLAG_META_SHA256 if metas == {True} else 0
        if manifest.masked:
            flags |= FLAG_TRAINED_TOKENS
        files = [s.file for s in shards]
        pattern = name_pattern(files)
        name_width = 0
        if pattern is None and n:
            flags |= FLAG_NAMES
            name_width = max(len(f.encode()) for f in files)
        dtype = row_dtype(flags, name_width)
        rows = np.zeros(n, dtype=dtype)  # shard order first, then rearranged group-major
        for key in ("bytes", "num_documents", "num_tokens"):
            rows[key] = np.fromiter((getattr(s, key) for s in shards), dtype=np.uint64, count=n)
        rows["sha256"] = _digests(s.sha256 for s in shards)
        if flags & FLAG_TRAINED_TOKENS:
            rows["trained_tokens"] = np.fromiter((s.trained_tokens for s in shards), np.uint64, n)
        if flags & FLAG_META_SHA256:
            rows["meta_sha256"] = _digests(s.meta_sha256 for s in shards)
        if flags & FLAG_NAMES:
            rows["name"] = np.array([f.encode() for f in files], dtype=f"S{name_width}")
        rows = rows[group_major(n, groups)]
        raw, width = rows.tobytes(), dtype.itemsize
        starts = [group_start(g, n, groups) * width for g in range(groups)] + [n * width]
        records = [raw[a:b] for a, b in zip(starts, starts[1:])]
        meta = {
            "dtype": manifest.dtype.name,
            "extra": manifest.extra,
            "name": manifest.name,
            "tokenizer": manifest.tokenizer,
            "vocab_size": manifest.vocab_size,
        }
        if manifest.masked:
            meta["sft"] = manifest.sft
        if pattern is not None:
            meta["names"] = pattern
        # Binds the rows, which a worker reads only in part, to the header index.json records.
        meta["rows_sha256"] = rows_digest(records)
        meta_bytes = json.dumps(meta, sort_keys=True, ensure_ascii=True).encode()
        tokens = np.fromiter((s.num_tokens for s in shards), dtype=np.int64, count=n)
        sums = group_sums(tokens, groups).astype("<u8")
        sums_at = align8(FIXED.size + len(meta_bytes))
        records_at = sums_at + 8 * groups
        fixed = FIXED.pack(
            MAGIC, VERSION, flags, n, groups, dtype.itemsize,
            manifest.num_tokens, manifest.num_documents, manifest.num_bytes,
            manifest.trained_tokens or 0,
            bytes(32), 0,  # index.json's sha256 and size: finish() fills them in
            len(meta_bytes), name_width, records_at, 0, 0,
        )  # fmt: skip
        head = bytearray(fixed + meta_bytes)
        head += bytes(sums_at - len(head))
        head += sums.tobytes()
        self.head = head
        self.digest = header_digest(head)
        self.records = records

    def finish(self, index_bytes: bytes) -> bytes:
        """The file, written with index.json `index_bytes` (which records ``digest``)."""
        head = bytearray(self.head)
        head[64:104] = hashlib.sha256(index_bytes).digest() + struct.pack("<Q", len(index_bytes))
        crc = zlib.crc32(head[FIXED.size :], zlib.crc32(head[:HEADER_CRC_AT]))
        head[HEADER_CRC_AT : HEADER_CRC_AT + 4] = struct.pack("<I", crc)
        out = [bytes(head)]
        for record in self.records:
            out += [record, struct.pack("<I", zlib.crc32(record))]
        return b"".join(out)


def compact_bytes(manifest, index_bytes: bytes) -> bytes:
    """The compact manifest of `manifest`, whose index.json is `index_bytes`."""
    return CompactDraft(manifest).finish(index_bytes)


__all__ = [
    "CompactDraft",
    "compact_bytes",
    "header_digest",
    "name_pattern",
    "pattern_name",
    "row_dtype",
    "rows_digest",
    "rows_digest_of",
]
