"""Mask frames for the readers: read by range or from a stream, decoded and checked like
token frames (size, zstd checksum or crc32), and refused unless every value is 0 or 1."""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.frames import FrameDecoder
from shardtok.format.mask_meta import check_mask_values
from shardtok.format.shard_head import ShardHead
from shardtok.format.shard_meta import Frame


def mask_frames(meta) -> list:
    """The mask frames as token-frame-shaped ``Frame`` rows (sizes in mask bytes = tokens), so
    ``FrameDecoder`` checks them exactly as it checks token frames."""
    itemsize = meta.dtype.itemsize
    return [
        Frame(
            m.compressed_offset,
            m.compressed_size,
            f.first_document,
            f.uncompressed_offset // itemsize,
            f.uncompressed_size // itemsize,
            m.crc32,
        )
        for m, f in zip(meta.mask.frames, meta.frames)
    ]


class MaskFrames:
    """Reads and checks mask frames by range, keeping the last one (documents share frames)."""

    def __init__(self, head: ShardHead, header, where: str, full_checks: bool = False):
        self.header = header
        self.frames = mask_frames(head.meta)
        self.decoder = FrameDecoder(
            head.meta.compressed, where, header.name, header.data_offset, full_checks
        )
        self._cached: tuple[int, bytes] | None = None
        # Frames of one stream can be decoded in two threads at once (``decode_ahead``); the
        # mask source's reads and the cache are then taken one thread at a time.
        self._lock = threading.Lock()

    def decode(self, frame_no: int, stored: bytes) -> np.ndarray:
        frame = self.frames[frame_no]
        raw = self.decoder.decode(frame, stored, frame_no)
        offset = self.header.data_offset + frame.compressed_offset
        return check_mask_values(raw, self.decoder.where, self.header.name, offset, frame_no)

    def frame(self, source, frame_no: int) -> bytes:
        with self._lock:
            cached = self._cached
            if cached is None or cached[0] != frame_no:
                frame = self.frames[frame_no]
                stored = source.read_range(
                    self.header.data_offset + frame.compressed_offset, frame.compressed_size
                )
                cached = self._cached = (frame_no, self.decode(frame_no, stored))
            return cached[1]


def check_mask_member(read_at, head, header, where: str) -> None:
    """Full check of the whole mask member read in order through `read_at(offset, n)` (the
    sequential reader's forward reads): every frame, the mask sha256 and the trained count."""
    mask = MaskFrames(head, header, where, full_checks=True)
    digest, trained = hashlib.sha256(), 0
    for n, frame in enumerate(mask.frames):
        values = mask.decode(
            n, read_at(header.data_offset + frame.compressed_offset, frame.compressed_size)
        )
        digest.update(values)
        trained += int(np.count_nonzero(values))
    info = head.meta.mask
    if digest.hexdigest() != info.sha256:
        raise CorruptShardError(
            where, header.name, header.data_offset, "mask bytes do not match the mask sha256"
        )
    if trained != info.trained_tokens:
        raise CorruptShardError(
            where,
            header.name,
            header.data_offset,
            f"mask has {trained} trained tokens, the metadata says {info.trained_tokens}",
        )
