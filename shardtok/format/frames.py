"""Encoding and decoding one frame of the bin member.

A frame is the concatenated bytes of whole documents. Compressed shards store each frame as an
independent zstd frame (content size and content checksum in the frame header), so `zstd -d`
over the whole member reproduces the Megatron .bin and any frame can be decoded on its own.
"""

from __future__ import annotations

import zlib

import zstandard

from shardtok.errors import CorruptShardError
from shardtok.format.shard_meta import Frame

DEFAULT_FRAME_SIZE = 1 << 20  # uncompressed bytes of tokens per frame
DEFAULT_COMPRESSION_LEVEL = 3


class FrameEncoder:
    """Compresses frames with fixed parameters so the output bytes are reproducible."""

    def __init__(self, level: int | None):
        self.level = level
        self._compressor = (
            None
            if level is None
            else zstandard.ZstdCompressor(
                level=level, write_checksum=True, write_content_size=True, threads=0
            )
        )

    def encode(self, raw: bytes) -> bytes:
        return raw if self._compressor is None else self._compressor.compress(raw)


class FrameDecoder:
    """Decodes and verifies frames; every failure names shard, member and byte offset."""

    def __init__(
        self,
        compressed: bool,
        where: str,
        member: str,
        member_data_offset: int,
        full_checks: bool = False,
    ):
        self.compressed = compressed
        self.where = where
        self.member = member
        self.member_data_offset = member_data_offset
        self._decompressor = zstandard.ZstdDecompressor() if compressed else None
        # A zstd frame's XXH64 content checksum already covers its decoded bytes, so the crc32
        # is only needed for uncompressed frames -- unless the caller asks for every check.
        self._check_crc = full_checks or not compressed

    def decode(self, frame: Frame, stored: bytes, number: int) -> bytes:
        offset = self.member_data_offset + frame.compressed_offset
        if len(stored) != frame.compressed_size:
            raise CorruptShardError(
                self.where,
                self.member,
                offset + len(stored),
                f"frame {number} truncated: {len(stored)} of {frame.compressed_size} bytes",
            )
        if self._decompressor is None:
            raw = stored
        else:
            try:
                raw = self._decompressor.decompress(stored, max_output_size=frame.uncompressed_size)
            except zstandard.ZstdError as exc:
                raise CorruptShardError(
                    self.where, self.member, offset, f"frame {number} does not decode: {exc}"
                ) from None
        if len(raw) != frame.uncompressed_size:
            raise CorruptShardError(
                self.where,
                self.member,
                offset,
                f"frame {number} decodes to {len(raw)} bytes, expected {frame.uncompressed_size}",
            )
        if self._check_crc and zlib.crc32(raw) != frame.crc32:
            raise CorruptShardError(
                self.where, self.member, offset, f"frame {number} fails its crc32 check"
            )
        return raw
