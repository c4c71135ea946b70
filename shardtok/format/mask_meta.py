"""The json's `mask` section: where the loss-mask frames of a shard are (added in 0.2).

A mask is one uint8 per token (1 = a training target), framed exactly like the token bytes:
mask frame n covers the documents of token frame n. Only what the token frame table does not
already fix is stored (stored offset and size, crc32), so a mask frame cannot disagree with its
token frame about documents or token counts. Shards without masks have no `mask` key, which
keeps their json (and meta_sha256) byte-identical to 0.1's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.validate import want_int, want_sha256, want_str


@dataclass(frozen=True)
class MaskFrame:
    compressed_offset: int  # from the start of the mask member's data
    compressed_size: int
    crc32: int  # zlib.crc32 of the frame's mask bytes

    def to_json(self) -> dict:
        return {
            "compressed_offset": self.compressed_offset,
            "compressed_size": self.compressed_size,
            "crc32": self.crc32,
        }


@dataclass(frozen=True)
class MaskInfo:
    member: str
    frames: tuple[MaskFrame, ...]
    sha256: str  # of the uncompressed mask bytes of the whole shard
    trained_tokens: int

    @property
    def stored_nbytes(self) -> int:
        return sum(f.compressed_size for f in self.frames)

    def to_json(self) -> dict:
        return {
            "frames": [f.to_json() for f in self.frames],
            "member": self.member,
            "sha256": self.sha256,
            "trained_tokens": self.trained_tokens,
        }


def mask_member(key: str, compressed: bool) -> str:
    return f"{key}.mask.zst" if compressed else f"{key}.mask"


def parse_mask(doc, fail) -> MaskInfo:
    if not isinstance(doc, dict):
        raise fail(f"field 'mask' is {doc!r}, not an object")
    frames_doc = doc.get("frames")
    if not isinstance(frames_doc, list):
        raise fail(f"field 'mask.frames' is {frames_doc!r}, not a list")
    frames = []
    for f in frames_doc:
        if not isinstance(f, dict):
            raise fail(f"a mask frame is {f!r}, not an object")
        frames.append(
            MaskFrame(
                want_int(f, "compressed_offset", fail),
                want_int(f, "compressed_size", fail),
                want_int(f, "crc32", fail, maximum=0xFFFFFFFF),
            )
        )
    return MaskInfo(
        member=want_str(doc, "member", fail),
        frames=tuple(frames),
        sha256=want_sha256(doc, "sha256", fail),
        trained_tokens=want_int(doc, "trained_tokens", fail),
    )


def check_mask(meta, fail) -> None:
    """The mask section against the (already checked) token frame table."""
    mask = meta.mask
    if mask.member != mask_member(meta.key, meta.compressed):
        raise fail(
            f"mask member {mask.member!r}, expected {mask_member(meta.key, meta.compressed)!r}"
        )
    if len(mask.frames) != len(meta.frames):
        raise fail(f"{len(mask.frames)} mask frames for {len(meta.frames)} token frames")
    if mask.trained_tokens > meta.num_tokens:
        raise fail(f"{mask.trained_tokens} trained tokens of {meta.num_tokens}")
    expected = 0
    itemsize = meta.dtype.itemsize
    for n, (m, f) in enumerate(zip(mask.frames, meta.frames)):
        if m.compressed_offset != expected:
            raise fail(f"mask frame {n} is not contiguous with the frame before it")
        if not meta.compressed and m.compressed_size != f.uncompressed_size // itemsize:
            raise fail(f"mask frame {n} of an uncompressed shard is not one byte per token")
        expected += m.compressed_size


def check_mask_values(raw: bytes, where: str, member: str, offset: int, number: int) -> np.ndarray:
    """A decoded mask frame as uint8, refused unless every value is 0 or 1."""
    values = np.frombuffer(raw, dtype=np.uint8)
    if values.size and int(values.max()) > 1:
        bad = int(np.flatnonzero(values > 1)[0])
        raise CorruptShardError(
            where, member, offset, f"mask frame {number}: value {values[bad]} at mask byte {bad}"
        )
    return values
