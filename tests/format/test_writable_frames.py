"""Frames decoded into a buffer of the caller's own (``FrameDecoder.decode(writable=True)``,
what a masked stream flags its tokens in): the same bytes as the immutable path, every check
kept -- in particular the zstd content checksum, which python-zstandard's stream reader only
verifies when the whole frame is in the stored bytes (hence ``zstd_frame_length``)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import zstandard

from shardtok.errors import CorruptShardError
from shardtok.format.frames import FrameDecoder, zstd_frame_length
from shardtok.format.shard_meta import Frame


def compress(raw: bytes, checksum: bool = True) -> bytes:
    return zstandard.ZstdCompressor(
        level=3, write_checksum=checksum, write_content_size=True
    ).compress(raw)


def tokens(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 50_000, n, dtype=np.int32).tobytes()


@pytest.mark.parametrize("n", [1, 1000, 300_000, 1_100_000])
@pytest.mark.parametrize("checksum", [True, False])
def test_the_frame_length_comes_from_the_block_headers(n, checksum):
    stored = compress(tokens(n, n), checksum)
    assert zstd_frame_length(stored) == len(stored)
    assert zstd_frame_length(stored + b"\0\1\2") == len(stored)  # what follows is not its
    assert zstd_frame_length(stored[:-1]) is None  # the checksum or a block cut short
    assert zstd_frame_length(stored[:3]) is None


def test_frame_length_of_rle_and_raw_blocks():
    rle = compress(b"\0" * 500_000)  # RLE blocks: one stored byte each
    assert zstd_frame_length(rle) == len(rle)
    incompressible = np.random.default_rng(1).bytes(300_000)  # raw blocks
    raw = compress(incompressible)
    assert zstd_frame_length(raw) == len(raw)
    assert zstd_frame_length(b"not a zstd frame at all") is None
    reserved = bytearray(compress(b"abc" * 10))
    header = zstandard.frame_header_size(bytes(reserved))
    reserved[header] |= 0b110  # block type 3: reserved
    assert zstd_frame_length(bytes(reserved)) is None


def decoder() -> FrameDecoder:
    return FrameDecoder(True, "shard-000000.tar", "shard-000000.bin.zst", 512)


def frame_of(raw: bytes, stored: bytes) -> Frame:
    return Frame(0, len(stored), 0, 0, len(raw), zlib.crc32(raw))


@pytest.mark.parametrize("n", [0, 7, 262_144])
def test_writable_frames_hold_the_same_bytes(n):
    raw = tokens(n, 3)
    stored = compress(raw)
    frame = frame_of(raw, stored)
    plain = decoder().decode(frame, stored, 0)
    own = decoder().decode(frame, stored, 0, writable=True)
    assert isinstance(plain, bytes)
    assert isinstance(own, np.ndarray) and own.dtype == np.uint8 and own.flags.writeable
    assert own.tobytes() == plain == raw
    own[:] = 0  # the caller's to write: the next decode is not affected
    assert decoder().decode(frame, stored, 0, writable=True).tobytes() == raw


def test_uncompressed_frames_come_writable_too():
    raw = tokens(100)
    d = FrameDecoder(False, "s.tar", "s.bin", 512)
    own = d.decode(frame_of(raw, raw), raw, 0, writable=True)
    assert own.flags.writeable and own.tobytes() == raw


def test_a_writable_frame_with_a_bad_checksum_is_refused():
    raw = tokens(50_000)
    stored = bytearray(compress(raw))
    stored[-1] ^= 1  # the content checksum
    with pytest.raises(CorruptShardError, match="frame 4 does not decode: .*checksum"):
        decoder().decode(frame_of(raw, stored), bytes(stored), 4, writable=True)


def test_a_frame_table_that_cuts_off_the_checksum_is_refused():
    # Without the length check the stream reader would decode every block and never see
    # the checksum: damaged tokens would pass.
    raw = tokens(50_000)
    stored = compress(raw)[:-4]
    frame = frame_of(raw, stored)
    with pytest.raises(CorruptShardError, match="frame 2 is .* bytes in the frame table, its zstd frame is cut short"):  # fmt: skip
        decoder().decode(frame, stored, 2, writable=True)
    with pytest.raises(CorruptShardError, match="frame 2 does not decode"):
        decoder().decode(frame, stored, 2)  # the immutable path refuses it as well


def test_a_frame_table_that_claims_bytes_past_the_frame_is_refused():
    raw = tokens(50_000)
    stored = compress(raw) + compress(b"")  # another frame after it
    with pytest.raises(CorruptShardError, match=r"zstd frame \d+"):
        decoder().decode(frame_of(raw, stored), stored, 0, writable=True)
