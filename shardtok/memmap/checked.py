"""Frame checks for the memmap path: each frame's crc32 the first time this process touches it.

Memory-mapped shard bytes reach the model without passing through a decoder, so a flipped byte
on disk would otherwise become a wrong token. Uncompressed shards keep a crc32 per frame (about
1 MiB) in their json; checking a frame on first touch costs one pass over bytes that are about
to be read anyway, and nothing is read up front. Each process (DataLoader worker) keeps its own
record of checked frames, since each maps the files itself.

Loss masks of uncompressed shards are mapped the same way, and their frames get the same check
(each mask frame's own crc32) plus the one a mask needs: every value is 0 or 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.mask_meta import check_mask_values
from shardtok.format.shard_reader import ShardReader


class FrameCheck:
    """Which token positions of the concatenated shards lie in which frame, and which frames
    this process has checked. `arrays[k]` are the tokens of `readers[k]`, end to end (with
    `masks`, their loss masks: the mask frames are checked)."""

    def __init__(
        self, readers: Sequence[ShardReader], arrays: Sequence[np.ndarray], masks: bool = False
    ):
        self.masks = masks
        self._arrays = list(arrays)
        self._readers = list(readers)
        starts, sizes, owners = [], [], []
        base = 0
        for k, reader in enumerate(self._readers):
            itemsize = reader.meta.dtype.itemsize
            for number, frame in enumerate(reader.meta.frames):
                starts.append(base + frame.uncompressed_offset // itemsize)
                sizes.append(frame.uncompressed_size // itemsize)
                owners.append((k, number))
            base += reader.meta.num_tokens
        self.starts = np.asarray(starts, dtype=np.int64)
        self._sizes = sizes
        self._owners = owners
        self._bases = np.cumsum([0] + [r.meta.num_tokens for r in self._readers])
        # Empty frames have nothing to damage (and share their start with the next frame).
        self.checked = np.asarray([n == 0 for n in sizes], dtype=bool)
        self.done = bool(self.checked.all())

    def _frames_of(self, positions) -> np.ndarray:
        return np.searchsorted(self.starts, positions, side="right") - 1

    def range(self, start: int, stop: int) -> None:
        """Check the frames that tokens [start, stop) lie in."""
        if self.done or stop <= start:
            return
        first, last = self._frames_of([start, stop - 1]).tolist()
        if not self.checked[first : last + 1].all():
            self._check_frames(range(first, last + 1))

    def ranges(self, begins: Sequence[int], lengths: Sequence[int]) -> None:
        """Check the frames of every range [begin, begin + length)."""
        if self.done:
            return
        begins = np.asarray(begins, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        keep = lengths > 0
        begins, ends = begins[keep], begins[keep] + lengths[keep]
        first, last = self._frames_of(begins), self._frames_of(ends - 1)
        checked = self.checked
        if checked[first].all() and checked[last].all() and bool(np.all(last - first <= 1)):
            return
        for a, b in zip(first.tolist(), last.tolist()):
            self._check_frames(range(a, b + 1))

    def positions(self, positions: np.ndarray) -> None:
        if self.done or positions.size == 0:
            return
        frames = np.unique(self._frames_of(positions.ravel()))
        self._check_frames(frames.tolist())

    def _check_frames(self, frames) -> None:
        for j in frames:
            if self.checked[j]:
                continue
            k, number = self._owners[j]
            local = int(self.starts[j] - self._bases[k])
            data = self._arrays[k][local : local + self._sizes[j]]
            reader = self._readers[k]
            if self.masks:
                self._check_mask_frame(reader, number, data)
            else:
                frame = reader.meta.frames[number]
                self._check_crc(
                    reader, reader.head.bin_header, frame.uncompressed_offset,
                    frame.uncompressed_size, frame.crc32, number, data,
                )  # fmt: skip
            self.checked[j] = True
        self.done = bool(self.checked.all())

    def _check_mask_frame(self, reader: ShardReader, number: int, data: np.ndarray) -> None:
        header = reader._mask.header  # type: ignore[union-attr]  # a masked shard
        offset = reader.meta.frames[number].uncompressed_offset // reader.meta.dtype.itemsize
        crc = reader.meta.mask.frames[number].crc32  # type: ignore[union-attr]
        self._check_crc(reader, header, offset, len(data), crc, number, data)
        check_mask_values(data, reader.where, header.name, header.data_offset + offset, number)

    @staticmethod
    def _check_crc(reader, header, offset: int, size: int, crc: int, number: int, data) -> None:
        if zlib.crc32(data) != crc:
            raise CorruptShardError(
                reader.where,
                header.name,
                header.data_offset + offset,
                f"frame {number} ({size} bytes from here) fails its crc32 check: the file was "
                "damaged after it was written",
            )


__all__ = ["FrameCheck"]
