"""A decoded frame's documents: views cut with one vectorized offset computation per frame,
alone or paired with (or combined with) the frame's loss mask. Shared by both shard readers."""

from __future__ import annotations

import numpy as np

from shardtok.format.shard_head import ShardHead
from shardtok.format.shard_meta import ShardMeta


def document_slices(
    head: ShardHead,
    frame_no: int,
    raw: bytes,
    start: int,
    stop: int,
    dtype=None,
    bits=None,
    combine=None,
) -> list:
    """Views of the documents of [start, stop) that begin in frame `frame_no`, decoded as `raw`;
    with `bits` (the frame's decoded mask), (tokens, mask) pairs of views, or with `combine`
    too, views of ``combine(tokens, mask)`` (one array for the frame)."""
    meta = head.meta
    frames = meta.frames
    first = frames[frame_no].first_document
    last = frames[frame_no + 1].first_document if frame_no + 1 < len(frames) else meta.num_documents
    lo, hi = max(first, start), min(last, stop)
    if lo >= hi:
        return []
    # `dtype`: uint8 for a mask frame, whose offsets in tokens equal the token frame's.
    tokens = np.frombuffer(raw, dtype=meta.dtype if dtype is None else dtype)
    itemsize = meta.dtype.itemsize
    base = frames[frame_no].uncompressed_offset // itemsize
    # One vectorized offset computation per frame, then plain slicing: the per-document cost
    # is what bounds streaming speed for short documents.
    begins = (head.index.pointers[lo:hi] // itemsize - base).tolist()
    sizes = head.index.sizes[lo:hi].tolist()
    if bits is None:
        return [tokens[b : b + n] for b, n in zip(begins, sizes)]
    # The mask frame's offsets in mask bytes equal the token frame's in tokens.
    mask = np.frombuffer(bits, dtype=np.uint8)
    if combine is not None:
        both = combine(tokens, mask)
        return [both[b : b + n] for b, n in zip(begins, sizes)]
    return [(tokens[b : b + n], mask[b : b + n]) for b, n in zip(begins, sizes)]


def frame_range(meta: ShardMeta, start: int, stop: int) -> range:
    firsts = [f.first_document for f in meta.frames]
    lo = int(np.searchsorted(firsts, start, side="right")) - 1
    hi = int(np.searchsorted(firsts, stop, side="left"))
    return range(max(lo, 0), hi)


def frame_documents(
    head, frame_no: int, raw: bytes, masks, source, start: int, stop: int, combine=None
):
    """The documents of one frame, paired with their masks (read from `source`) when `masks`
    is set (or combined with them by `combine`)."""
    bits = None if masks is None else masks.frame(source, frame_no)
    return document_slices(head, frame_no, raw, start, stop, bits=bits, combine=combine)
