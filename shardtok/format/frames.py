"""Encoding and decoding one frame of the bin member.

A frame is the concatenated bytes of whole documents. Compressed shards store each frame as an
independent zstd frame (content size and content checksum in the frame header), so `zstd -d`
over the whole member reproduces the Megatron .bin and any frame can be decoded on its own.
"""

from __future__ import annotations

import zlib

import numpy as np
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


class FrameBuilder:
    """Cuts a run of documents into frames by the writer's rule and encodes each as it closes.

    The rule is ShardBuilder's: a frame is closed before a document that would push a non-empty
    frame past `frame_size`. Only the documents given here are framed, and :meth:`finish` closes
    the last frame, so the frames depend on these documents alone -- which is what lets convert's
    workers compress their own unit while earlier units are still being tokenized.
    Encoded frames go to `out` as they close; :meth:`finish` returns the frame table.
    """

    def __init__(
        self, frame_size: int, level: int | None, out, encoder: FrameEncoder | None = None
    ):
        """`encoder`: a FrameEncoder of `level` to use (one thread at a time) instead of a new
        one: making a compression context cost a worker ~20 µs per 256 KiB unit."""
        self.frame_size = frame_size
        if encoder is not None and encoder.level != level:
            raise ValueError(f"a FrameEncoder of level {encoder.level} given for level {level}")
        self._encoder = encoder if encoder is not None else FrameEncoder(level)
        self._out = out
        self._rows: list[tuple[int, int, int, int]] = []
        self._pending: list = []  # bytes-like pieces of the open frame
        self._pending_bytes = 0
        self._pending_docs = 0
        self._pending_first = 0
        self._documents = 0

    def add(self, tokens: np.ndarray, sizes: np.ndarray) -> None:
        """Append documents: `tokens` concatenated, `sizes` tokens per document."""
        raw = memoryview(np.ascontiguousarray(tokens)).cast("B")
        itemsize = tokens.dtype.itemsize
        start = pos = 0  # raw[start:pos] belongs to the open frame
        for n in (np.asarray(sizes, dtype=np.int64) * itemsize).tolist():
            if self._pending_bytes > 0 and self._pending_bytes + n > self.frame_size:
                self._pending.append(raw[start:pos])
                start = pos
                self._close()
            if self._pending_docs == 0:
                self._pending_first = self._documents
            self._pending_docs += 1
            self._pending_bytes += n
            self._documents += 1
            pos += n
        if pos != raw.nbytes:
            raise ValueError(f"sizes cover {pos} bytes of tokens, the tokens are {raw.nbytes}")
        if pos > start:
            self._pending.append(bytes(raw[start:pos]))  # the caller may reuse its buffer

    def _close(self) -> None:
        data = b"".join(self._pending)
        stored = self._encoder.encode(data)
        self._rows.append((self._pending_first, len(data), len(stored), zlib.crc32(data)))
        self._out.write(stored)
        self._pending, self._pending_bytes, self._pending_docs = [], 0, 0

    def finish(self) -> np.ndarray:
        """Close the open frame; rows of (first document, uncompressed size, stored size, crc32)."""
        if self._pending_docs:
            self._close()
        return np.asarray(self._rows, dtype=np.int64).reshape(-1, 4)


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
        # Idle decompression contexts. A context serves one call at a time, and a stream's
        # frames can be decoded in two threads at once (``decode_ahead``: the caller helps
        # while it waits), so each call takes one, making another only when all are busy.
        self._contexts: list[zstandard.ZstdDecompressor] = []
        # A zstd frame's XXH64 content checksum already covers its decoded bytes, so the crc32
        # is only needed for uncompressed frames -- unless the caller asks for every check.
        self._check_crc = full_checks or not compressed

    def decode(self, frame: Frame, stored: bytes, number: int, writable: bool = False):
        """Frame `number`'s decoded bytes, checked: immutable bytes, or with `writable` a
        uint8 array of the caller's own (the stream flags masked tokens in it, in place,
        instead of writing a second megabyte per frame)."""
        offset = self.member_data_offset + frame.compressed_offset
        if len(stored) != frame.compressed_size:
            raise CorruptShardError(
                self.where,
                self.member,
                offset + len(stored),
                f"frame {number} truncated: {len(stored)} of {frame.compressed_size} bytes",
            )
        if not self.compressed:
            raw = np.frombuffer(bytearray(stored), np.uint8) if writable else stored
        else:
            try:
                # decompress() allocates the content size the zstd frame header declares and
                # ignores max_output_size then: a few KB could claim gigabytes. Compare first.
                declared = zstandard.get_frame_parameters(stored).content_size
                # (max_output_size=0 means "no limit", so an empty frame must declare 0.)
                unknown_ok = frame.uncompressed_size > 0
                if declared != frame.uncompressed_size and not (
                    unknown_ok and declared == zstandard.CONTENTSIZE_UNKNOWN
                ):
                    raise CorruptShardError(
                        self.where,
                        self.member,
                        offset,
                        f"frame {number} declares {declared} bytes, the frame table "
                        f"{frame.uncompressed_size}",
                    )
                if writable and declared == frame.uncompressed_size:
                    raw = self._decompress_into(stored, frame.uncompressed_size, number, offset)
                else:
                    raw = self._decompress(stored, frame.uncompressed_size)
                    if writable:
                        raw = np.frombuffer(bytearray(raw), np.uint8)
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

    def _context(self) -> zstandard.ZstdDecompressor:
        try:
            return self._contexts.pop()  # list.pop and append are atomic: no lock needed
        except IndexError:
            return zstandard.ZstdDecompressor()

    def _decompress(self, stored: bytes, size: int) -> bytes:
        context = self._context()
        try:
            return context.decompress(stored, max_output_size=size)
        finally:
            self._contexts.append(context)

    def _decompress_into(self, stored: bytes, size: int, number: int, offset: int) -> np.ndarray:
        """`stored` (a frame declaring `size` bytes) decoded into a new writable array.

        python-zstandard decodes into a given buffer only through a stream reader, which
        verifies the content checksum only where the whole frame is in `stored` (zstd's
        single-pass path); a frame table that cut off the checksum would go unnoticed. So the
        frame's length is taken from its block headers first and must be all of `stored`."""
        length = zstd_frame_length(stored)
        if length != len(stored):
            raise CorruptShardError(
                self.where,
                self.member,
                offset,
                f"frame {number} is {len(stored)} bytes in the frame table, its zstd frame "
                + ("is cut short" if length is None else f"{length}"),
            )
        out = np.empty(size, dtype=np.uint8)
        context = self._context()
        try:
            # closed before the context goes back to the pool another thread takes it from
            with context.stream_reader(stored) as reader:
                got = reader.readinto(out)
        finally:
            self._contexts.append(context)
        return out if got == size else out[:got]


_BLOCK_RLE, _BLOCK_RESERVED = 1, 3


def zstd_frame_length(data: bytes) -> int | None:
    """The bytes of the zstd frame at the start of `data` (header, blocks and content
    checksum, by the format's block headers, RFC 8878 section 3.1.1), or None where `data`
    ends first or a block header is invalid."""
    if len(data) < 5:
        return None
    try:
        at = zstandard.frame_header_size(data)
    except zstandard.ZstdError:
        return None
    checksum = 4 if data[4] & 0x04 else 0  # Content_Checksum_flag of the frame header
    end = len(data)
    while at + 3 <= end:
        header = data[at] | data[at + 1] << 8 | data[at + 2] << 16
        kind = (header >> 1) & 3
        if kind == _BLOCK_RESERVED:
            return None
        at += 3 + (1 if kind == _BLOCK_RLE else header >> 3)
        if header & 1:  # Last_Block
            at += checksum
            return at if at <= end else None
    return None
