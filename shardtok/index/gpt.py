"""Megatron GPT indices: which tokens form sample ``i`` of a GPTDataset.

Megatron-core (0.16.1, ``gpt_dataset.py`` + ``helpers.cpp``) turns a set of documents into
fixed-length samples with three arrays, all reproduced here bit for bit:

``document_index``
    The documents of every epoch, concatenated and shuffled (int32). With several epochs whose
    last one is only partly used, the last epoch is shuffled on its own ("separate final epoch"),
    so its documents are not under-sampled.
``sample_index``
    ``(num_samples + 1, 2)`` rows ``(position in document_index, token offset in that document)``;
    sample ``k`` runs from row ``k`` to row ``k + 1`` (plus one extra token for the shifted labels).
``shuffle_index``
    A permutation of the samples; the separate final epoch is again shuffled on its own.

Everything is numpy only and vectorized (``cumsum`` + ``searchsorted``), with no Python loop per
sample; all randomness comes from one ``numpy.random.RandomState(seed)`` drawn in Megatron's order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# How many documents are turned into token end positions at once; bounds the int64 scratch
# memory of build_sample_idx to ~64 MiB whatever the corpus size.
_DOCUMENT_BLOCK = 1 << 23

# Megatron separates the final epoch when it contributes fewer than this fraction of an epoch.
_SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80


class GptIndices(NamedTuple):
    """The three arrays of a Megatron GPTDataset (see the module docstring)."""

    document_index: np.ndarray
    sample_index: np.ndarray
    shuffle_index: np.ndarray


def _num_samples_for(total_tokens: int, seq_length: int, extra: int, drop_last: bool) -> int:
    if drop_last:
        return (total_tokens - extra) // seq_length
    # helpers.cpp computes ceil(float(tokens - extra) / seq_length) in single precision; keep
    # that rounding so the sample count matches Megatron even past 2**24 tokens.
    quotient = np.float32(total_tokens - extra) / np.float32(seq_length)
    return int(math.ceil(float(quotient)))


def build_sample_idx(
    sizes: np.ndarray,
    doc_idx: np.ndarray,
    seq_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> np.ndarray:
    """Megatron's ``helpers.build_sample_idx``, vectorized.

    Sample ``k`` starts at flat token position ``k * seq_length`` of the documents laid end to
    end in ``doc_idx`` order. Its row is ``(d, position - start of document d)`` where ``d`` is
    the first document whose end reaches ``position + extra`` (``extra`` = 1 when every sample
    carries one more token for the shifted labels), so a sample never starts on the last token
    of a document when the extra token is on. Rows past the last document (possible only with
    ``drop_last_partial_sequence=False``) are ``(len(doc_idx) - 1, size of that document -
    extra)``, exactly as the C++ loop leaves them.

    Returns an int32 array of shape ``(num_samples + 1, 2)``, or int64 when
    ``max(len(doc_idx), sizes.max())`` does not fit in int32 (Megatron's rule).

    >>> build_sample_idx(np.array([20, 50, 60, 30, 100, 5]), np.arange(6), 30, 1, 265).tolist()
    [[0, 0], [1, 10], [1, 40], [2, 20], [2, 50], [3, 20], [4, 20], [4, 50], [4, 80]]
    """
    sizes = np.asarray(sizes)
    doc_idx = np.asarray(doc_idx)
    if seq_length < 2:
        raise ValueError(f"seq_length must be at least 2, got {seq_length}")
    if num_epochs < 1:
        raise ValueError(f"num_epochs must be at least 1, got {num_epochs}")
    if tokens_per_epoch < 2:
        raise ValueError(f"tokens_per_epoch must be at least 2, got {tokens_per_epoch}")
    if doc_idx.ndim != 1 or doc_idx.size == 0:
        raise ValueError("doc_idx must be a non-empty 1-D array")
    extra = int(bool(add_extra_token_to_sequence))

    largest_value = max(int(doc_idx.shape[0]), int(sizes.max()))
    dtype = np.int32 if largest_value <= np.iinfo(np.int32).max else np.int64
    num_samples = _num_samples_for(
        num_epochs * tokens_per_epoch, seq_length, extra, drop_last_partial_sequence
    )

    sample_idx = np.empty((num_samples + 1, 2), dtype=dtype)
    sample_idx[0] = (0, 0)
    next_sample = 1  # first sample boundary not yet placed
    tokens_before_block = 0
    for block_start in range(0, doc_idx.shape[0], _DOCUMENT_BLOCK):
        if next_sample > num_samples:
            break
        lengths = sizes[doc_idx[block_start : block_start + _DOCUMENT_BLOCK]].astype(np.int64)
        ends = np.cumsum(lengths) + tokens_before_block
        block_end_tokens = int(ends[-1]) if ends.size else tokens_before_block
        # Boundary k lands in this block when k * seq_length + extra <= block_end_tokens.
        last_sample = min(num_samples, (block_end_tokens - extra) // seq_length)
        if last_sample >= next_sample:
            positions = np.arange(next_sample, last_sample + 1, dtype=np.int64) * seq_length
            in_block = np.searchsorted(ends, positions + extra, side="left")
            document_starts = ends[in_block] - lengths[in_block]
            rows = sample_idx[next_sample : last_sample + 1]
            rows[:, 0] = in_block + block_start
            rows[:, 1] = positions - document_starts
            next_sample = last_sample + 1
        tokens_before_block = block_end_tokens

    if next_sample <= num_samples:
        # Ran out of documents: the C++ loop pins every remaining boundary to the last token(s).
        last = doc_idx.shape[0] - 1
        last_offset = int(sizes[doc_idx[last]]) - extra
        if last_offset < 0:
            # The C++ would write offset -1 here (megatron's Python wrapper then fails an
            # assertion); refuse rather than hand out an index that cuts wrong tokens.
            raise ValueError(
                f"the last document in doc_idx (document {int(doc_idx[last])}) is empty, so the "
                "final partial sample has no valid end; drop it (drop_last_partial_sequence=True)"
            )
        sample_idx[next_sample:, 0] = last
        sample_idx[next_sample:, 1] = last_offset
    return sample_idx


def build_document_index(
    documents: np.ndarray | Sequence[int],
    num_epochs: int,
    numpy_random_state: np.random.RandomState,
    separate_final_epoch: bool,
) -> np.ndarray:
    """Megatron's ``_build_document_index``: ``documents`` repeated ``num_epochs`` times, shuffled.

    With ``separate_final_epoch`` (and more than one epoch) the first ``num_epochs - 1`` epochs
    are shuffled together and the last epoch separately after them, drawing from the same
    random state in that order. Returns int32.
    """
    documents = np.asarray(documents)
    if not separate_final_epoch or num_epochs == 1:
        document_index = np.tile(documents, num_epochs).astype(np.int32)
        numpy_random_state.shuffle(document_index)
        return document_index
    first = build_document_index(documents, num_epochs - 1, numpy_random_state, False)
    last = build_document_index(documents, 1, numpy_random_state, False)
    return np.concatenate((first, last))


def build_shuffle_index(
    num_samples: int, total_size: int, numpy_random_state: np.random.RandomState
) -> np.ndarray:
    """Megatron's ``_build_shuffle_index``: ``[0, num_samples)`` shuffled, then, if
    ``total_size > num_samples``, ``[num_samples, total_size)`` shuffled separately after it.

    uint32 unless ``total_size >= 2**32 - 2``, then int64 (Megatron's rule).
    """
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(0, num_samples, dtype=dtype)
    numpy_random_state.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    numpy_random_state.shuffle(last)
    return np.concatenate((first, last))


def num_epochs_for(
    tokens_per_epoch: int, seq_length: int, num_samples: int | None, extra: int = 1
) -> int:
    """Epochs needed to draw ``num_samples`` samples (Megatron's ``_get_num_epochs``); 1 if None."""
    if num_samples is None:
        return 1
    tokens_requested = num_samples * seq_length + extra
    return max(1, -(-tokens_requested // tokens_per_epoch))


def _separate_final_epoch(
    tokens_per_epoch: int, seq_length: int, num_samples: int, num_epochs: int, extra: int
) -> tuple[bool, int]:
    """Megatron's rule: shuffle the final epoch apart when less than 80 % of it is used.

    Returns (separate?, number of samples in the epochs before the final one).
    """
    samples_before_final = ((num_epochs - 1) * tokens_per_epoch - extra) // seq_length
    samples_from_final = num_samples - samples_before_final
    samples_per_epoch = (tokens_per_epoch - extra) // seq_length
    separate = samples_from_final < int(_SEPARATE_FINAL_EPOCH_THRESHOLD * samples_per_epoch)
    return separate, samples_before_final


def build_gpt_indices(
    sizes: np.ndarray,
    seq_length: int,
    num_samples: int | None,
    seed: int,
    documents: np.ndarray | Sequence[int] | None = None,
    add_extra_token_to_sequence: bool = True,
    drop_last_partial_sequence: bool = True,
) -> GptIndices:
    """The (document, sample, shuffle) indices Megatron's ``GPTDataset`` builds.

    Args:
        sizes: tokens per document of the whole indexed dataset (the ``.idx`` sizes).
        seq_length: tokens per sample (each sample carries one more token when
            ``add_extra_token_to_sequence``).
        num_samples: samples wanted; enough epochs are built to cover them (the result may hold
            more, as in Megatron). None: exactly one epoch.
        seed: Megatron's ``random_seed``.
        documents: the document ids of this split (Megatron's ``indexed_indices``, e.g.
            ``np.arange(begin, end)``); None: every document.
        drop_last_partial_sequence: False keeps a final partial sample (Megatron does so only
            for a validation split with ``drop_last_partial_validation_sequence=False``).
    """
    sizes = np.asarray(sizes)
    if documents is None:
        documents = np.arange(sizes.shape[0], dtype=np.int32)
    documents = np.asarray(documents)
    if documents.size == 0:
        raise ValueError("build_gpt_indices needs at least one document")
    if num_samples is not None and num_samples < 0:
        raise ValueError(f"num_samples must be >= 0 or None, got {num_samples}")
    extra = int(bool(add_extra_token_to_sequence))
    tokens_per_epoch = int(np.sum(sizes[documents], dtype=np.int64))
    if tokens_per_epoch <= extra:
        raise ValueError(
            f"the {documents.size} documents hold {tokens_per_epoch} tokens: "
            "too few for even one sample"
        )
    num_epochs = num_epochs_for(tokens_per_epoch, seq_length, num_samples, extra)

    separate, samples_before_final = False, 0
    if num_epochs > 1:
        assert num_samples is not None  # one epoch unless samples were requested
        separate, samples_before_final = _separate_final_epoch(
            tokens_per_epoch, seq_length, num_samples, num_epochs, extra
        )

    random_state = np.random.RandomState(seed)
    document_index = build_document_index(documents, num_epochs, random_state, separate)
    sample_index = build_sample_idx(
        sizes,
        document_index,
        seq_length,
        num_epochs,
        tokens_per_epoch,
        drop_last_partial_sequence,
        add_extra_token_to_sequence,
    )
    total = sample_index.shape[0] - 1
    first_range = samples_before_final if separate else total
    shuffle_index = build_shuffle_index(first_range, total, random_state)
    return GptIndices(document_index, sample_index, shuffle_index)
