"""Memmap batches planned in runs: where the tokens and document segments of many batches lie,
found in one vectorized pass, then each batch written with a few whole-batch numpy calls.

Why: a batch of 8 Megatron samples has only ~25 document pieces and ~30 segments, so finding
them one batch at a time was 45 numpy calls on arrays of 8 to 30 elements (~40 µs, about as
much as copying the batch), and the segment bookkeeping (row starts, sort, per-row numbering,
cu_seqlens, ignored labels) another ~15 µs of Python per batch. A loader knows its next batches
in advance (the epoch's order), so ``ShardLoader`` plans a run of them with the same handful of
calls and each batch only copies: its token runs into one buffer, then ``input_ids``,
``labels``, ``position_ids`` and ``document_ids`` from it. A DataLoader's ``__getitems__`` plans
a run of one batch.

The batches are those of ``shardtok.stream.batch.assemble_contiguous_batch`` on the same samples
(``tests/torch/test_memmap_plan.py``); the crc32 checks of shard frames happen when a run is
planned, before any of its tokens are used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardtok.memmap.samples import GPTSamples, read_paired_ranges, read_ranges, zero_or_one
from shardtok.stream.batch import (
    IGNORE_INDEX,
    Allocator,
    allocate_arrays,
    check_labels_format,
)
from shardtok.stream.masked import VALUES, flag_untrained
from shardtok.stream.segments import cached_arange as _arange


class _Counts(dict):
    """``0, 1, ..., n - 1`` as a view, per n: a batch's position_ids are these views of its
    segment lengths end to end (one concatenate: 40% less than ``arange - repeat(starts)``)."""

    def __init__(self, longest: int):
        super().__init__()
        self.counting = np.arange(longest, dtype=np.int64)

    def __missing__(self, n: int) -> np.ndarray:
        view = self[n] = self.counting[:n]
        return view


_COUNTS: dict[int, _Counts] = {}


class BatchPlan:
    """Batches of `samples`: batch ``j`` holds the ``sizes[j]`` samples that follow those of
    the batches before it in `indices` (all batches' sample indices end to end)."""

    def __init__(
        self,
        samples: GPTSamples,
        indices: Sequence[int] | np.ndarray,
        sizes: Sequence[int],
        *,
        mask_boundary_labels: bool = False,
        labels_format: str = "shifted",
    ):
        check_labels_format(labels_format)
        self.sizes = [int(n) for n in sizes]
        if sum(self.sizes) != len(indices) or min(self.sizes, default=1) < 1:
            raise ValueError(f"batch sizes {self.sizes} do not cut {len(indices)} samples")
        self.hf = labels_format == "hf"
        self.masked = samples.masks is not None
        seq_len = self.seq_len = samples.seq_length
        window = seq_len + 1
        rows = len(indices)
        begins, lengths, offsets = samples.pieces(indices)
        if self.masked:
            self._runs, self._mask_runs = read_paired_ranges(
                samples.tokens, samples.masks, begins, lengths
            )
        else:
            self._runs = read_ranges(samples.tokens, begins, lengths)
        if int(lengths.sum()) != rows * window:
            raise AssertionError(f"planned {int(lengths.sum())} tokens for {rows} samples")
        self.dtype = samples.tokens.dtype

        first_row = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=first_row[1:])
        self._first_row = first_row.tolist()
        # Each batch's runs: from the first that begins at or after its first token.
        self._first_run = np.searchsorted(offsets, first_row * window).tolist()

        # Documents beginning inside a row (a row start is always a segment start).
        starts_at = offsets[offsets % window != 0]
        row, column = np.divmod(starts_at, window)
        inner = column < seq_len  # one starting at the extra token is only a target
        # Segment starts over all batches' inputs (row r begins at r * seq_len), ascending.
        segments = np.sort(
            np.concatenate((_arange(rows) * seq_len, row[inner] * seq_len + column[inner]))
        )
        row_first_segment = np.searchsorted(segments, _arange(rows) * seq_len)
        # A batch's last segment ends where the next batch's first row begins: one table.
        self._bounds = np.append(segments, rows * seq_len)
        self._lengths = np.diff(self._bounds)
        self._length_list = self._lengths.tolist()
        counts = _COUNTS.get(seq_len)
        self._counts = (
            counts if counts is not None else _COUNTS.setdefault(seq_len, _Counts(seq_len))
        )
        self._local = (np.arange(len(segments)) - row_first_segment[segments // seq_len]).astype(
            np.int32
        )
        first_segment = np.append(row_first_segment, len(segments))[first_row]
        self._first_segment = first_segment.tolist()
        self._max_seqlen = np.maximum.reduceat(self._lengths, first_segment[:-1]).tolist()

        # Targets that are another document's first token: -100 when boundaries are masked.
        self._ignore = mask_boundary_labels or self.masked
        ignored = row * seq_len + column - 1
        if self.hf:  # the hf labels sit one column right; a last-column target is dropped
            ignored = ignored[ignored % seq_len != seq_len - 1] + 1
        self._first_ignored = np.searchsorted(ignored, first_row * seq_len).tolist()
        self._ignored = ignored
        self._buffer: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sizes)

    def batch(self, j: int, allocate: Allocator = allocate_arrays) -> dict:
        """Batch `j` as numpy arrays from `allocate` (the streaming batch's keys)."""
        rows, seq_len = self.sizes[j], self.seq_len
        window = seq_len + 1
        out = allocate(rows, seq_len)
        grid = self._tokens(j, rows * window).reshape(rows, window)
        input_ids, labels = out["input_ids"], out["labels"]
        a, b = self._first_ignored[j], self._first_ignored[j + 1]
        ignored = self._ignored[a:b] - self._first_row[j] * seq_len if self._ignore else None
        if self.masked:
            np.bitwise_and(grid[:, :-1], VALUES, out=input_ids, casting="unsafe")
        else:
            np.copyto(input_ids, grid[:, :-1], casting="unsafe")
        if self.hf:
            np.copyto(labels[:, 1:], grid[:, 1:-1], casting="unsafe")
            labels[:, 0] = IGNORE_INDEX
        else:
            np.copyto(labels, grid[:, 1:], casting="unsafe")
        if self.masked:  # untrained targets are negative: max(target, -100)
            np.maximum(labels, IGNORE_INDEX, out=labels)
        if ignored is not None and len(ignored):
            labels.reshape(-1)[ignored] = IGNORE_INDEX

        a, b = self._first_segment[j], self._first_segment[j + 1]
        bounds = self._bounds[a : b + 1] - self._first_row[j] * seq_len
        lengths = self._lengths[a:b]
        counts = self._counts
        np.concatenate(
            [counts[n] for n in self._length_list[a:b]], out=out["position_ids"].reshape(-1)
        )
        out["document_ids"].reshape(-1)[:] = np.repeat(self._local[a:b], lengths)
        cu = out["cu_seqlens"][: len(bounds)]
        cu[:] = bounds
        if self.masked:
            trained = labels.size - int(np.count_nonzero(labels == IGNORE_INDEX))
        else:
            trained = rows * (seq_len - 1 if self.hf else seq_len)
            trained -= 0 if ignored is None else len(ignored)
        source_ids = out.get("source_ids")
        if source_ids is None:
            source_ids = np.empty(rows, dtype=np.int64)
        source_ids[:] = 0  # one token array: one source
        return {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": out["position_ids"],
            "document_ids": out["document_ids"],
            "cu_seqlens": cu,
            "max_seqlen": self._max_seqlen[j],
            "num_trained_tokens": trained,
            "source_ids": source_ids,
        }

    def _tokens(self, j: int, count: int) -> np.ndarray:
        """Batch `j`'s tokens end to end (masked data: flagged int32), in a reused buffer."""
        a, b = self._first_run[j], self._first_run[j + 1]
        if self.masked:
            tokens = _joined(self._runs[a:b])
            return flag_untrained(tokens, zero_or_one(_joined(self._mask_runs[a:b])))
        buffer = self._buffer
        if buffer is None or len(buffer) < count:
            buffer = self._buffer = np.empty(count, dtype=self.dtype)
        return np.concatenate(self._runs[a:b], out=buffer[:count])


def _joined(runs: list[np.ndarray]) -> np.ndarray:
    return runs[0] if len(runs) == 1 else np.concatenate(runs)


__all__ = ["BatchPlan"]
