"""A decoded frame's documents: views cut with one vectorized offset computation per frame,
alone or paired with (or combined with) the frame's loss mask. Shared by both shard readers.

Two steps, so that a reader can do the first in a helper thread (``decode_ahead``): the frame
as one array (``frame_view``: where masks are combined with tokens, one numpy pass) and its
documents as slices of it (``cut_documents``)."""

from __future__ import annotations

import numpy as np

from shardtok.format.shard_head import ShardHead
from shardtok.format.shard_meta import ShardMeta


def frame_view(head: ShardHead, raw: bytes, dtype=None, bits=None, combine=None):
    """Decoded frame bytes `raw` as what its documents are cut from: a token array (`dtype`:
    uint8 for a mask frame); with `bits` (the frame's decoded mask) a (tokens, mask) pair of
    arrays, or with `combine` too, ``combine(tokens, mask)`` (one array)."""
    tokens = np.frombuffer(raw, dtype=head.meta.dtype if dtype is None else dtype)
    if bits is None:
        return tokens
    # The mask frame's offsets in mask bytes equal the token frame's in tokens.
    mask = np.frombuffer(bits, dtype=np.uint8)
    if combine is not None:
        return combine(tokens, mask)
    return tokens, mask


def cut_documents(head: ShardHead, frame_no: int, view, start: int, stop: int) -> list:
    """The documents of [start, stop) that begin in frame `frame_no`, as views of the frame's
    `view` (``frame_view``): arrays, or (tokens, mask) pairs for a pair."""
    meta = head.meta
    frames = meta.frames
    first = frames[frame_no].first_document
    last = frames[frame_no + 1].first_document if frame_no + 1 < len(frames) else meta.num_documents
    lo, hi = max(first, start), min(last, stop)
    if lo >= hi:
        return []
    itemsize = meta.dtype.itemsize
    base = frames[frame_no].uncompressed_offset // itemsize
    # One vectorized offset computation per frame, then plain slicing: the per-document cost
    # is what bounds streaming speed for short documents.
    begins = (head.index.pointers[lo:hi] // itemsize - base).tolist()
    sizes = head.index.sizes[lo:hi].tolist()
    if isinstance(view, tuple):
        tokens, mask = view
        return [(tokens[b : b + n], mask[b : b + n]) for b, n in zip(begins, sizes)]
    return [view[b : b + n] for b, n in zip(begins, sizes)]


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
    view = frame_view(head, raw, dtype, bits, combine)
    return cut_documents(head, frame_no, view, start, stop)


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
