"""The `<key>.json` member: what a shard holds and where its frames are.

The json is written with sorted keys and no whitespace, so it is part of the deterministic bytes.
Parsing validates every field a reader relies on; the cross-checks against the index live in
:func:`check_against_index`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.mask_meta import MaskInfo, check_mask, parse_mask
from shardtok.format.mmidx import MMIndex
from shardtok.format.validate import (
    want_dict,
    want_int,
    want_plain_name,
    want_sha256,
    want_str,
    want_token_fields,
)

SHARD_FORMAT = "shardtok-shard"
SHARD_FORMAT_VERSION = 1
COMPRESSIONS = ("zstd", "none")


@dataclass(frozen=True)
class Frame:
    """One independently decodable run of whole documents inside the bin member."""

    compressed_offset: int  # from the start of the bin member's data
    compressed_size: int
    first_document: int
    uncompressed_offset: int  # byte offset in the uncompressed .bin
    uncompressed_size: int
    crc32: int  # zlib.crc32 of the uncompressed bytes

    def to_json(self) -> dict:
        return {
            "compressed_offset": self.compressed_offset,
            "compressed_size": self.compressed_size,
            "crc32": self.crc32,
            "first_document": self.first_document,
            "uncompressed_offset": self.uncompressed_offset,
            "uncompressed_size": self.uncompressed_size,
        }


@dataclass(frozen=True)
class ShardMeta:
    key: str
    dtype: np.dtype
    vocab_size: int
    num_documents: int
    num_tokens: int
    compression: str  # "zstd" or "none"
    compression_level: int | None
    frames: tuple[Frame, ...]
    bin_sha256: str
    idx_sha256: str
    tokenizer: dict = field(default_factory=dict)
    provenance: tuple[dict, ...] = ()
    mask: MaskInfo | None = None  # loss masks (added in 0.2); None keeps the 0.1 json
    # The json's meta_sha256 as read (the manifest names shards by it); not part of equality.
    read_sha256: str | None = field(default=None, compare=False)

    @property
    def sha256(self) -> str:
        """The meta_sha256 this json carries (computed for a json not yet written)."""
        if self.read_sha256 is not None:
            return self.read_sha256
        return hashlib.sha256(_canonical(self._json_fields())).hexdigest()

    @property
    def compressed(self) -> bool:
        return self.compression == "zstd"

    @property
    def json_member(self) -> str:
        return f"{self.key}.json"

    @property
    def idx_member(self) -> str:
        return f"{self.key}.idx"

    @property
    def bin_member(self) -> str:
        return f"{self.key}.bin.zst" if self.compressed else f"{self.key}.bin"

    @property
    def bin_nbytes(self) -> int:
        return self.num_tokens * self.dtype.itemsize

    @property
    def stored_bin_nbytes(self) -> int:
        return sum(f.compressed_size for f in self.frames)

    def to_json_bytes(self) -> bytes:
        doc = self._json_fields()
        doc["meta_sha256"] = hashlib.sha256(_canonical(doc)).hexdigest()
        return _canonical(doc) + b"\n"

    def _json_fields(self) -> dict:
        doc = {
            "bin_sha256": self.bin_sha256,
            "compression": self.compression,
            "compression_level": self.compression_level,
            "dtype": self.dtype.name,
            "format": SHARD_FORMAT,
            "format_version": SHARD_FORMAT_VERSION,
            "frames": [f.to_json() for f in self.frames],
            "idx_sha256": self.idx_sha256,
            "key": self.key,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "provenance": list(self.provenance),
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
        }
        if self.mask is not None:
            doc["mask"] = self.mask.to_json()
        return doc

    @classmethod
    def from_json_bytes(cls, data: bytes, where: str, member: str, offset: int) -> ShardMeta:
        def fail(reason: str) -> CorruptShardError:
            return CorruptShardError(where, member, offset, reason)

        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise fail(f"metadata is not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != SHARD_FORMAT:
            raise fail(
                f"not a shardtok shard (format field {doc.get('format') if isinstance(doc, dict) else doc!r})"
            )
        # The json has no checksum around it (the tar header covers only itself), so it carries
        # a sha256 of its own canonical form without that field.
        claimed = doc.pop("meta_sha256", None)
        if claimed != hashlib.sha256(_canonical(doc)).hexdigest():
            raise fail("metadata fails its meta_sha256 check")
        if doc.get("format_version") != SHARD_FORMAT_VERSION:
            raise fail(
                f"shard format version {doc.get('format_version')} is not supported by this shardtok "
                f"(reads version {SHARD_FORMAT_VERSION})"
            )
        frames_doc = doc.get("frames")
        if not isinstance(frames_doc, list):
            raise fail(f"field 'frames' is {frames_doc!r}, not a list")
        frames = tuple(_frame(f, fail) for f in frames_doc)
        dtype, vocab_size = want_token_fields(doc, fail)
        level = doc.get("compression_level")
        if level is not None:
            level = want_int(doc, "compression_level", fail, minimum=None)
        provenance = doc.get("provenance") or []
        if not isinstance(provenance, list):
            raise fail(f"field 'provenance' is {provenance!r}, not a list")
        meta = cls(
            key=want_plain_name(doc, "key", fail),
            dtype=dtype,
            vocab_size=vocab_size,
            num_documents=want_int(doc, "num_documents", fail),
            num_tokens=want_int(doc, "num_tokens", fail),
            compression=want_str(doc, "compression", fail),
            compression_level=level,
            frames=frames,
            bin_sha256=want_sha256(doc, "bin_sha256", fail),
            idx_sha256=want_sha256(doc, "idx_sha256", fail),
            tokenizer=want_dict(doc, "tokenizer", fail),
            provenance=tuple(provenance),
            mask=None if "mask" not in doc else parse_mask(doc["mask"], fail),
            read_sha256=claimed,
        )
        if meta.compression not in COMPRESSIONS:
            raise fail(f"unknown compression {meta.compression!r}")
        _check_frames(meta, fail)
        if meta.mask is not None:
            check_mask(meta, fail)
        return meta


def _frame(doc, fail) -> Frame:
    if not isinstance(doc, dict):
        raise fail(f"a frame is {doc!r}, not an object")
    return Frame(
        want_int(doc, "compressed_offset", fail),
        want_int(doc, "compressed_size", fail),
        want_int(doc, "first_document", fail),
        want_int(doc, "uncompressed_offset", fail),
        want_int(doc, "uncompressed_size", fail),
        want_int(doc, "crc32", fail, maximum=0xFFFFFFFF),
    )


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _check_frames(meta: ShardMeta, fail) -> None:
    expected_c = expected_u = 0
    previous_first = -1
    for n, f in enumerate(meta.frames):
        if f.compressed_offset != expected_c or f.uncompressed_offset != expected_u:
            raise fail(f"frame {n} is not contiguous with the frame before it")
        if f.first_document <= previous_first or f.first_document >= max(meta.num_documents, 1):
            raise fail(f"frame {n} first document {f.first_document} is out of order or range")
        if not meta.compressed and f.compressed_size != f.uncompressed_size:
            raise fail(f"frame {n} of an uncompressed shard has different stored and token sizes")
        previous_first = f.first_document
        expected_c += f.compressed_size
        expected_u += f.uncompressed_size
    if expected_u != meta.bin_nbytes:
        raise fail(f"frames cover {expected_u} token bytes, metadata says {meta.bin_nbytes}")
    if meta.num_documents and (not meta.frames or meta.frames[0].first_document != 0):
        raise fail("the first frame must start at document 0")


def check_against_index(
    meta: ShardMeta, index: MMIndex, where: str, member: str, offset: int
) -> None:
    """The json and the idx must describe the same documents."""

    def fail(reason: str) -> CorruptShardError:
        return CorruptShardError(where, member, offset, reason)

    if index.dtype != meta.dtype:
        raise fail(f"index dtype {index.dtype} != metadata dtype {meta.dtype}")
    if index.num_sequences != meta.num_documents:
        raise fail(f"index has {index.num_sequences} documents, metadata says {meta.num_documents}")
    if not np.array_equal(index.doc_idx, np.arange(index.num_sequences + 1)):
        raise fail("shard indices hold exactly one sequence per document")
    if index.bin_nbytes != meta.bin_nbytes:
        raise fail(
            f"index sizes sum to {index.bin_nbytes // meta.dtype.itemsize} tokens, metadata says {meta.num_tokens}"
        )
    for n, f in enumerate(meta.frames):
        if int(index.pointers[f.first_document]) != f.uncompressed_offset:
            raise fail(
                f"frame {n} starts at byte {f.uncompressed_offset} but document {f.first_document} at {index.pointers[f.first_document]}"
            )
