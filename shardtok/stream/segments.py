"""A batch's per-segment arrays (position_ids, document_ids, cu_seqlens) from where its
segments start: the compiled pass where it was built, else its numpy twin.

Why compiled: numpy makes the positions as ``arange - starts.repeat(lengths)`` and the
document numbers as ``ids.repeat(lengths)``, a temporary of a token each and a copy out of
it, where the arrays need only be written once. In one process that was a tenth of the main
thread's time per batch (issue 18: PyArray_Repeat, LONG_subtract and their memmoves at 12% of
it in perf, 11 µs of a ~75 µs batch; the kernel takes 2.5 µs). ``_segments.c`` is optional at
install (no C compiler: the twin runs) and the twin stays the reference it is tested against
(tests/stream/test_segments_kernel.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

try:  # compiled at install where a C compiler is found (pyproject.toml: optional)
    from shardtok.stream._segments import contiguous as _contiguous_kernel
    from shardtok.stream._segments import segments as _segments_kernel
except ImportError:  # pragma: no cover - a build without a compiler: the twins below
    _segments_kernel = _contiguous_kernel = None


_ARANGE_CACHE: dict[int, np.ndarray] = {}


def cached_arange(n: int) -> np.ndarray:
    """``np.arange(n)`` as int64, made once per n (read-only)."""
    out = _ARANGE_CACHE.get(n)
    if out is None:
        out = _ARANGE_CACHE[n] = np.arange(n, dtype=np.int64)
        out.flags.writeable = False
    return out


def fill_segments(
    starts: list[int],
    local_ids: list[int],
    position_ids: np.ndarray,
    document_ids: np.ndarray,
    cu_seqlens: np.ndarray,
) -> int:
    """Write, for the segments beginning at the flat positions `starts` (ascending, the first
    0) with the numbers `local_ids` within their rows: each token's position in its segment
    into `position_ids` (int64), its segment's number into `document_ids` (int32, same size),
    and the starts followed by the total into the first ``len(starts) + 1`` items of
    `cu_seqlens` (int32). Returns the longest segment."""
    if _segments_kernel is not None:
        return _segments_kernel(starts, local_ids, position_ids, document_ids, cu_seqlens)
    return fill_segments_numpy(starts, local_ids, position_ids, document_ids, cu_seqlens)


def fill_segments_numpy(
    starts: list[int],
    local_ids: list[int],
    position_ids: np.ndarray,
    document_ids: np.ndarray,
    cu_seqlens: np.ndarray,
) -> int:
    """`fill_segments` with numpy alone (the kernel's twin)."""
    total = position_ids.size
    ends = starts[1:]
    ends.append(total)
    lengths = [end - start for start, end in zip(starts, ends)]  # a few dozen: plain Python
    bounds = np.array(starts, dtype=np.int64)
    np.subtract(cached_arange(total), bounds.repeat(lengths), out=position_ids.reshape(-1))
    document_ids.reshape(-1)[:] = np.array(local_ids, dtype=np.int32).repeat(lengths)
    n = len(starts)
    cu_seqlens[:n] = bounds
    cu_seqlens[n] = total
    return max(lengths)


def contiguous_segments(
    boundaries: Sequence[int],
    rows: int,
    position_ids: np.ndarray,
    document_ids: np.ndarray,
    cu_seqlens: np.ndarray,
) -> tuple[int, int]:
    """`fill_segments` for `rows` rows of ``S = position_ids.size // rows`` inputs cut from
    one run of ``rows * (S + 1)`` tokens (concat packing's batch) where documents begin at the
    flat token positions `boundaries` (ascending, inside the run) besides its start: each row
    starts a segment, and so does each document beginning at a column below S (one at the
    last column is a target only). Returns how many segments there are and the longest."""
    if _contiguous_kernel is not None:
        if not isinstance(boundaries, list):  # the kernel reads a list (of ints or numpy's)
            boundaries = list(boundaries)
        return _contiguous_kernel(boundaries, rows, position_ids, document_ids, cu_seqlens)
    return contiguous_segments_python(boundaries, rows, position_ids, document_ids, cu_seqlens)


def contiguous_segments_python(
    boundaries: Sequence[int],
    rows: int,
    position_ids: np.ndarray,
    document_ids: np.ndarray,
    cu_seqlens: np.ndarray,
) -> tuple[int, int]:
    """`contiguous_segments` without the kernel (its twin): the segment starts in plain Python
    (a batch has a few dozen), then `fill_segments_numpy`."""
    seq_len = position_ids.size // rows
    window = seq_len + 1
    starts: list[int] = []
    local_ids: list[int] = []
    row = -1
    number = 0
    # The boundaries ascend, so the starts come out in order with their numbers in the row.
    for position in boundaries:
        r, column = divmod(position, window)
        while row < r:
            row += 1
            starts.append(row * seq_len)
            local_ids.append(0)
            number = 0
        if column and column < seq_len:  # a document starting a row is the row's own
            number += 1
            starts.append(r * seq_len + column)
            local_ids.append(number)
    while row < rows - 1:
        row += 1
        starts.append(row * seq_len)
        local_ids.append(0)
    longest = fill_segments_numpy(starts, local_ids, position_ids, document_ids, cu_seqlens)
    return len(starts), longest
