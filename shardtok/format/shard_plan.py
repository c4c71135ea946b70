"""Where shards end, and writing a shard from frames that were encoded elsewhere.

The one rule for shard boundaries: a shard is finished before a frame once the stored bytes of its
frames (compressed, when compressing) have reached `shard_size`. Boundaries therefore fall between
frames and depend only on the frames' stored sizes, in order. DatasetWriter applies the rule as
frames arrive; convert's merge applies it to every unit's frame table up front and then writes the
shards in parallel. Both then append frames with :func:`append_frames` and finish the shard with
:func:`write_shard`, so a shard's bytes come from one writer whichever path made it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from shardtok.format.frames import FrameBuilder
from shardtok.format.manifest import ShardEntry
from shardtok.format.mmidx import token_dtype
from shardtok.format.shard_writer import ShardBuilder


def shard_is_full(stored_bytes: int, shard_size: int) -> bool:
    """Whether a shard holding `stored_bytes` of frames is finished before its next frame."""
    return stored_bytes >= shard_size


def plan_shards(stored_sizes: Iterable[int], shard_size: int) -> list[tuple[int, int]]:
    """[first frame, end frame) of every shard, given the stored size of every frame in order.

    A shard always gets at least one frame (a frame larger than `shard_size` fills one alone);
    no frames, no shards.
    """
    ranges: list[tuple[int, int]] = []
    first = stored = count = 0
    for frame, size in enumerate(stored_sizes):
        if frame > first and shard_is_full(stored, shard_size):
            ranges.append((first, frame))
            first, stored = frame, 0
        stored += int(size)
        count = frame + 1
    if count > first:
        ranges.append((first, count))
    return ranges


def shard_file_name(name: str, number: int) -> str:
    return f"{name}-{number:06d}.tar"


@dataclass(frozen=True)
class ShardSettings:
    """What every shard of one dataset shares (small and picklable: sent to merge tasks)."""

    name: str
    dtype: np.dtype
    vocab_size: int
    compression_level: int | None
    frame_size: int
    tokenizer: dict
    masked: bool = False

    def file(self, number: int) -> str:
        return shard_file_name(self.name, number)

    def builder(self, number: int) -> ShardBuilder:
        return ShardBuilder(
            f"{self.name}-{number:06d}",
            token_dtype(self.dtype),
            self.vocab_size,
            self.compression_level,
            self.frame_size,
            self.tokenizer,
            self.masked,
        )


def check_ids(tokens: np.ndarray, vocab_size: int) -> None:
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)][0]
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def check_mask(mask, ntokens: int) -> np.ndarray:
    """A document's (or documents') loss mask checked: one 0/1 per token; returned as uint8."""
    mask = np.asarray(mask)
    if mask.shape != (ntokens,) or (mask.size and mask.dtype.kind not in "biu"):
        raise ValueError(
            f"a mask is one 0/1 per token: shape ({ntokens},), got {mask.shape} {mask.dtype}"
        )
    if mask.size and (int(mask.min()) < 0 or int(mask.max()) > 1):
        raise ValueError("mask values must be 0 or 1")
    return mask.astype(np.uint8, copy=False)


def encode_frames(
    tokens: np.ndarray, sizes: np.ndarray, frame_size: int, level: int | None
) -> tuple[np.ndarray, memoryview]:
    """Documents cut into frames and encoded afresh (frame table, encoded frames): for frames
    that were made with another frame size or compression level."""
    buffer = io.BytesIO()
    framer = FrameBuilder(frame_size, level, buffer)
    framer.add(tokens, sizes)
    return framer.finish(), buffer.getbuffer()


def _runs(provenance, first: int, end: int) -> list[tuple[str, int, int]]:
    """(file, first record, last record) runs of consecutive records among documents first..end."""
    files, file_of, record_of = provenance
    codes = np.asarray(file_of[first:end])
    records = np.asarray(record_of[first:end], dtype=np.int64)
    breaks = np.flatnonzero((codes[1:] != codes[:-1]) | (records[1:] != records[:-1] + 1)) + 1
    starts = [0, *breaks.tolist()]
    stops = [*breaks.tolist(), len(records)]
    return [
        (files[int(codes[a])], int(records[a]), int(records[b - 1])) for a, b in zip(starts, stops)
    ]


@dataclass(frozen=True)
class FramedDocs:
    """Documents already cut into frames and encoded by a
    :class:`~shardtok.format.frames.FrameBuilder` (with the shards' frame size and level).

    `tokens` the documents concatenated, `sizes` their token counts, `frames` the builder's table
    (first document counted from 0 here, uncompressed size, stored size, crc32), `stored` the
    encoded frames concatenated, `provenance` (file names, file index of each document, record of
    each document) or None, `masks` (masked datasets) the documents' raw 0/1 masks concatenated.
    Build it with :meth:`checked`.
    """

    tokens: np.ndarray
    sizes: np.ndarray
    frames: np.ndarray
    stored: memoryview
    provenance: tuple | None = None
    masks: np.ndarray | None = None

    @classmethod
    def checked(
        cls, tokens, sizes, frames, stored, dtype, vocab_size, provenance=None, masks=None
    ) -> FramedDocs:
        """Validated against the dataset's dtype and vocabulary (masks are the caller's to check)."""
        tokens = np.asarray(tokens)
        sizes = np.asarray(sizes, dtype=np.int64)
        if tokens.dtype != dtype or tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D {dtype} array, got {tokens.dtype}")
        if int(sizes.sum()) != tokens.size:
            raise ValueError(f"sizes add up to {int(sizes.sum())} tokens, not {tokens.size}")
        check_ids(tokens, vocab_size)
        frames = np.asarray(frames, dtype=np.int64).reshape(-1, 4)
        stored = memoryview(stored).cast("B")
        if int(frames[:, 2].sum()) != stored.nbytes:
            raise ValueError("the frame table does not add up to the stored bytes")
        return cls(tokens, sizes, frames, stored, provenance, masks)

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    @cached_property
    def _stored_at(self) -> list[int]:
        return [0, *np.cumsum(self.frames[:, 2]).tolist()]

    @cached_property
    def _doc_ends(self) -> np.ndarray:
        return np.cumsum(self.sizes)


def append_frames(builder: ShardBuilder, docs: FramedDocs, first: int, end: int) -> None:
    """Append frames first..end-1 of `docs` to the shard being built, unchanged."""
    firsts = docs.frames[:, 0].tolist()
    doc_ends = docs._doc_ends
    itemsize = docs.tokens.dtype.itemsize
    for f in range(first, end):
        _, raw_size, stored_size, crc = docs.frames[f].tolist()
        lo_doc = firsts[f]
        hi_doc = firsts[f + 1] if f + 1 < len(firsts) else docs.sizes.size
        if hi_doc <= lo_doc:
            raise ValueError(f"frame {f} holds no documents")
        lo = int(doc_ends[lo_doc - 1]) if lo_doc else 0
        hi = int(doc_ends[hi_doc - 1])
        if (hi - lo) * itemsize != raw_size:
            raise ValueError(f"frame {f}: its documents are not {raw_size} bytes")
        at = docs._stored_at[f]
        builder.add_frame(
            docs.stored[at : at + stored_size],
            docs.tokens[lo:hi],
            docs.sizes[lo_doc:hi_doc],
            crc,
            () if docs.provenance is None else _runs(docs.provenance, lo_doc, hi_doc),
            None if docs.masks is None else docs.masks[lo:hi],
        )


def write_shard(builder: ShardBuilder, path: str | Path) -> ShardEntry:
    """Write the shard to `path` (atomically) and return its manifest entry."""
    path = Path(path)
    meta, size, sha = builder.write(path)
    return ShardEntry(
        path.name,
        size,
        meta.num_documents,
        meta.num_tokens,
        sha,
        meta.sha256,
        None if meta.mask is None else meta.mask.trained_tokens,
    )


def build_shard(
    settings: ShardSettings,
    number: int,
    parts: Iterable[tuple[FramedDocs, int, int]],
    path: str | Path,
) -> ShardEntry:
    """Write shard `number` from `parts`, each (docs, first frame, end frame), in order; `parts`
    may be a generator, so a caller can load one unit's frames at a time."""
    builder = settings.builder(number)
    for docs, first, end in parts:
        append_frames(builder, docs, first, end)
    return write_shard(builder, path)
