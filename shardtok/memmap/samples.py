"""Random-access GPT samples over one flat token array, with Megatron GPTDataset semantics.

For local uncompressed data the tokens of every document already lie end to end in one array
(a Megatron ``.bin`` or an uncompressed shard's ``.bin`` member, memory-mapped), and ``sizes``
says where each document ends. :class:`GPTSamples` builds Megatron's document/sample/shuffle
indices (:mod:`shardtok.index.gpt`) over them and cuts sample ``i`` out of the array exactly as
``megatron.core.datasets.gpt_dataset.GPTDataset`` does: the same ``seq_length + 1`` tokens (the
concatenation of Megatron's ``tokens`` and the last of its ``labels``) for the same ``i``, seed
and sample count. It takes plain arrays and never imports torch.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from shardtok.index.cache import cached_gpt_indices
from shardtok.index.gpt import GptIndices, build_gpt_indices


class SampleDocuments(NamedTuple):
    """Where the tokens of one sample come from, one entry per document piece, in order.

    ``lengths`` sums to ``seq_length + 1``; ``np.concatenate(([0], np.cumsum(lengths)))`` gives
    the ``cu_seqlens`` of block-causal attention. A document can be empty (length 0).
    """

    document_ids: np.ndarray  # int64: document (sequence) ids, as Megatron's document_ids
    starts: np.ndarray  # int64: token offset inside each document where the piece begins
    lengths: np.ndarray  # int64: tokens taken from each document


class SamplePieces(NamedTuple):
    """The non-empty document pieces of several samples laid end to end, in order."""

    begins: np.ndarray  # int64: where each piece begins in the token array
    lengths: np.ndarray  # int64, > 0: its tokens
    offsets: np.ndarray  # int64: where it begins in the samples end to end


class GPTSamples:
    """Map-style source of ``seq_length + 1``-token samples (int64), Megatron GPTDataset order.

    Args:
        tokens: every token of every document, end to end (1-D array or memmap, any int dtype).
        sizes: tokens per document (the ``.idx`` sizes); must sum to ``len(tokens)``.
        seq_length: tokens per training sequence; samples carry one more for the shifted labels.
        num_samples: samples wanted (enough epochs are built, Megatron style); None: one epoch.
        seed: Megatron's ``random_seed``.
        documents: the document ids of this split (Megatron's ``indexed_indices``); None: all.
        cache_dir: if given, the indices are stored there and memory-mapped on later runs
            (:func:`shardtok.index.cache.cached_gpt_indices`).
        masks: loss masks beside `tokens` (one uint8 0/1 per token), or None; a sample's mask
            is cut from them exactly as its tokens are (``mask``, ``gather_with_masks``).

    ``len()`` is the number of samples the built epochs hold, as Megatron's ``len(GPTDataset)``:
    at least ``num_samples``, possibly a few more.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        sizes: np.ndarray,
        seq_length: int,
        num_samples: int | None = None,
        seed: int = 1234,
        documents: np.ndarray | Sequence[int] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        masks: np.ndarray | None = None,
    ) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
        sizes = np.asarray(sizes)
        if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer):
            raise ValueError("sizes must be a 1-D integer array (tokens per document)")
        if sizes.size and int(sizes.min()) < 0:
            raise ValueError("sizes must not be negative")
        ends = np.cumsum(sizes, dtype=np.int64)
        total = int(ends[-1]) if ends.size else 0
        if total != tokens.shape[0]:
            raise ValueError(
                f"sizes add up to {total} tokens but the token array holds {tokens.shape[0]}"
            )
        if masks is not None and len(masks) != tokens.shape[0]:
            raise ValueError(f"{len(masks)} mask values for {tokens.shape[0]} tokens")
        self.tokens = tokens
        self.masks = masks
        self.sizes = sizes
        self.seq_length = int(seq_length)
        self.document_starts = ends - sizes
        if cache_dir is None:
            indices = build_gpt_indices(sizes, seq_length, num_samples, seed, documents)
        else:
            indices = cached_gpt_indices(cache_dir, sizes, seq_length, num_samples, seed, documents)
        # Cached indices come back as np.memmap, whose __getitem__ costs microseconds per element
        # access; plain ndarray views of the same pages do not.
        self.indices: GptIndices = indices._replace(
            **{k: np.asarray(v).view(np.ndarray) for k, v in indices._asdict().items()}
        )

    def __len__(self) -> int:
        return int(self.indices.sample_index.shape[0]) - 1

    def document_boundaries(self, i: int) -> SampleDocuments:
        """The documents (and the token ranges in them) that make up sample ``i``."""
        position = int(self.indices.shuffle_index[self._check_index(i)])
        first, first_offset = (int(v) for v in self.indices.sample_index[position])
        last, last_offset = (int(v) for v in self.indices.sample_index[position + 1])
        document_ids = self.indices.document_index[first : last + 1].astype(np.int64)
        starts = np.zeros(document_ids.shape[0], dtype=np.int64)
        starts[0] = first_offset
        ends = self.sizes[document_ids].astype(np.int64)
        # The extra token: the last piece reaches one past the next sample's start.
        ends[-1] = last_offset + 1
        return SampleDocuments(document_ids, starts, ends - starts)

    def __getitem__(self, i: int) -> np.ndarray:
        """Sample ``i``: ``seq_length + 1`` tokens (int64), Megatron's ``tokens`` + last label."""
        return np.asarray(self._sample(self.tokens, i), dtype=np.int64)

    def mask(self, i: int) -> np.ndarray:
        """The loss mask (uint8) of sample ``i``'s tokens; needs `masks`."""
        if self.masks is None:
            raise ValueError("these samples have no loss masks")
        return zero_or_one(np.asarray(self._sample(self.masks, i), dtype=np.uint8))

    def _sample(self, values, i: int):
        pieces = self.document_boundaries(i)
        flat_starts = self.document_starts[pieces.document_ids] + pieces.starts
        if flat_starts.shape[0] == 1:
            begin = int(flat_starts[0])
            return values[begin : begin + int(pieces.lengths[0])]
        # One gather for all pieces: token positions = piece start + position inside the piece.
        piece_offsets = np.cumsum(pieces.lengths) - pieces.lengths
        positions = np.repeat(flat_starts - piece_offsets, pieces.lengths)
        positions += np.arange(positions.shape[0], dtype=np.int64)
        return values[positions]

    def gather(self, indices: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        """Samples `indices` end to end: ``len(indices) * (seq_length + 1)`` tokens in the stored
        dtype (row ``r`` is sample ``indices[r]``, the same tokens as ``self[indices[r]]``),
        and the flat positions where a document piece begins inside a row (row starts left
        out), ascending: what :func:`shardtok.stream.batch.assemble_contiguous_batch` takes.

        Vectorized over the batch: one copy per document piece, no per-sample numpy calls.
        """
        tokens, boundaries, _ = self._gather(indices, False)
        return tokens, boundaries

    def gather_with_masks(self, indices: Sequence[int]) -> tuple[np.ndarray, list[int], np.ndarray]:
        """`gather`, plus the samples' loss masks end to end (uint8, as long as the tokens)."""
        if self.masks is None:
            raise ValueError("these samples have no loss masks")
        return self._gather(indices, True)  # type: ignore[return-value]

    def pieces(self, indices: Sequence[int] | np.ndarray) -> SamplePieces:
        """The non-empty document pieces of samples `indices` laid end to end (row ``r`` is
        sample ``indices[r]``, ``seq_length + 1`` tokens), in order.

        Vectorized over every sample at once: a loader plans many batches with one call.
        """
        length = len(self)
        checked = np.array(indices, dtype=np.int64)  # a copy: negative indices are shifted
        if checked.size and (checked.min() < -length or checked.max() >= length):
            bad = next(int(i) for i in checked.tolist() if not -length <= i < length)
            raise IndexError(f"sample {bad} out of range for {length} samples")
        checked[checked < 0] += length
        ix = self.indices
        position = ix.shuffle_index[checked].astype(np.int64)
        first, first_offset = ix.sample_index[position].astype(np.int64).T
        last, last_offset = ix.sample_index[position + 1].astype(np.int64).T
        counts = last - first + 1  # document pieces per sample
        total = int(counts.sum())
        row_begin = np.cumsum(counts) - counts  # index of each sample's first piece
        piece = np.arange(total, dtype=np.int64)
        document_ids = ix.document_index[np.repeat(first - row_begin, counts) + piece]
        starts = np.zeros(total, dtype=np.int64)
        starts[row_begin] = first_offset
        ends = self.sizes[document_ids].astype(np.int64)
        ends[row_begin + counts - 1] = last_offset + 1  # the extra token, as in __getitem__
        lengths = ends - starts
        begins = self.document_starts[document_ids] + starts
        offsets = np.cumsum(lengths) - lengths
        keep = lengths > 0
        return SamplePieces(begins[keep], lengths[keep], offsets[keep])

    def _gather(self, indices: Sequence[int], with_masks: bool):
        rows = len(indices)
        window = self.seq_length + 1
        begins, lengths, offsets = self.pieces(indices)
        boundaries = offsets[offsets % window != 0].tolist()
        if with_masks:
            pieces, mask_pieces = read_paired_ranges(self.tokens, self.masks, begins, lengths)
        else:
            pieces = read_ranges(self.tokens, begins, lengths)
        tokens = np.concatenate(pieces) if len(pieces) != 1 else pieces[0]
        if len(tokens) != rows * window:
            raise AssertionError(f"gathered {len(tokens)} tokens for {rows} samples of {window}")
        if not with_masks:
            return tokens, boundaries, None
        mask = np.concatenate(mask_pieces) if len(mask_pieces) != 1 else mask_pieces[0]
        return tokens, boundaries, zero_or_one(mask)

    def _check_index(self, i: int) -> int:
        i = operator.index(i)
        length = len(self)
        if not -length <= i < length:
            raise IndexError(f"sample {i} out of range for {length} samples")
        return i + length if i < 0 else i


def zero_or_one(mask: np.ndarray) -> np.ndarray:
    """`mask` itself, once no value in it is above 1 (a ValueError otherwise)."""
    # Shard masks are checked per frame; a Megatron mask pair has no checksums, and a mask
    # byte above 1 would otherwise be read as "trained" by the batch builder's bool view.
    if mask.size and int(mask.max()) > 1:
        raise ValueError(f"a loss mask holds the value {int(mask.max())}: masks are 0 or 1")
    return mask


def read_paired_ranges(tokens, masks, begins, lengths):
    """`read_ranges` of `tokens` and of the `masks` beside them, in one pass when both are
    shards' ConcatTokens (which share their bounds)."""
    paired = getattr(tokens, "paired_ranges", None)
    if paired is not None and getattr(masks, "paired_ranges", None) is not None:
        return paired(begins, lengths, masks)
    return read_ranges(tokens, begins, lengths), read_ranges(masks, begins, lengths)


def read_ranges(tokens, begins, lengths) -> list[np.ndarray]:
    """``[tokens[b : b + n] for b, n in zip(begins, lengths) if n]`` (int sequences or int64
    arrays), fast for either token source (an array, or a ConcatTokens of shard memmaps)."""
    ranges = getattr(tokens, "ranges", None)
    if ranges is not None:
        return ranges(begins, lengths)
    if isinstance(tokens, np.memmap):  # a Megatron .bin: np.memmap slices cost microseconds
        tokens = tokens.view(np.ndarray)
    begins, lengths = (v.tolist() if isinstance(v, np.ndarray) else v for v in (begins, lengths))
    return [tokens[b : b + n] for b, n in zip(begins, lengths) if n]
