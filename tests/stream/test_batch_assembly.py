"""Batch assembly against a plain per-token reference: inputs, labels (both formats) and the
trained count, for flagged (masked) and unflagged rows, padded or full, row by row
(``assemble_batch``) and as one token run (``assemble_contiguous_batch``).

The fast paths work on whole batches (a scratch array of the token rows for masked data, a
slice per padded row); the reference decides every label on its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream.batch import (
    BATCH_KEYS,
    IGNORE_INDEX,
    allocate_arrays,
    assemble_batch,
    assemble_contiguous_batch,
    to_hf_labels,
)
from shardtok.stream.masked import flag_untrained
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.greedy import GreedyPacker

MASKS = ("random", "all untrained", "all trained")


def reference(ids, mask, starts, lengths, boundary_rows, labels_format):
    """(input_ids, labels, trained) decided token by token: a target is -100 when it is
    padding, untrained, or (`boundary_rows[b]`) the first token of a later document."""
    rows, window = ids.shape
    labels = np.full((rows, window - 1), IGNORE_INDEX, dtype=np.int64)
    for b in range(rows):
        for i in range(window - 1):
            target = i + 1
            if target >= lengths[b] or not mask[b, target]:
                continue
            if boundary_rows[b] and target in starts[b]:
                continue
            labels[b, i] = ids[b, target]
    if labels_format == "hf":
        labels = to_hf_labels(labels)
    return ids[:, :-1].astype(np.int64), labels, int((labels != IGNORE_INDEX).sum())


def make_mask(kind, shape, rng):
    if kind == "all untrained":
        return np.zeros(shape, np.uint8)
    if kind == "all trained":
        return np.ones(shape, np.uint8)
    return (rng.random(shape) < 0.5).astype(np.uint8)


# what both property tests draw: the rows of a batch and how they are labelled
ROWS = dict(
    rows=st.integers(1, 4),
    seq_len=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    mask_kind=st.sampled_from(MASKS),
    masked=st.booleans(),
    boundary=st.booleans(),
    labels_format=st.sampled_from(["shifted", "hf"]),
)


@settings(max_examples=150, deadline=None)
@given(**ROWS, staging=st.sampled_from([np.int32, np.int64]))
def test_rows_match_the_reference(
    rows, seq_len, seed, mask_kind, masked, boundary, labels_format, staging
):
    rng = np.random.default_rng(seed)
    window = seq_len + 1
    ids = rng.integers(0, 2**31 - 1 if seed % 2 else 50_000, (rows, window)).astype(np.int64)
    mask = make_mask(mask_kind, ids.shape, rng) if masked else np.ones(ids.shape, np.uint8)
    lengths = [int(rng.integers(1, window + 1)) for _ in range(rows)]  # a row holds a token
    lengths[0] = window if seed % 3 == 0 else lengths[0]  # a full row now and then
    starts = []
    for length in lengths:
        cuts = rng.integers(1, length + 1, size=int(rng.integers(0, 4)))
        starts.append(sorted({0, *(int(c) for c in cuts if c < length)}))
    for b, length in enumerate(lengths):
        ids[b, length:] = 0  # padding, as the packers write it
        mask[b, length:] = 0
    sft_rows = [masked and bool(rng.integers(0, 2)) if b else masked for b in range(rows)]
    if masked:  # rows without masks in a masked batch (a mix) count as all trained
        for b in range(rows):
            if not sft_rows[b]:
                mask[b, : lengths[b]] = 1
    grid = flag_untrained(ids.astype(np.int32), mask) if masked else ids
    batch = assemble_batch(
        grid.astype(staging),
        starts,
        lengths,
        mask_boundary_labels=boundary,
        labels_format=labels_format,
        masked=masked,
        sft_rows=sft_rows if masked else None,
    )
    boundary_rows = [boundary or sft for sft in sft_rows] if masked else [boundary] * rows
    inputs, labels, trained = reference(ids, mask, starts, lengths, boundary_rows, labels_format)
    assert np.array_equal(batch["input_ids"], inputs)
    assert np.array_equal(batch["labels"], labels)
    assert batch["num_trained_tokens"] == trained


@settings(max_examples=150, deadline=None)
@given(**ROWS)
def test_one_token_run_matches_the_reference(
    rows, seq_len, seed, mask_kind, masked, boundary, labels_format
):
    rng = np.random.default_rng(seed)
    window = seq_len + 1
    total = rows * window
    ids = rng.integers(0, 50_000, total).astype(np.int32)
    mask = make_mask(mask_kind, total, rng) if masked else np.ones(total, np.uint8)
    boundaries = sorted({int(p) for p in rng.integers(1, total, size=int(rng.integers(0, 6)))})
    tokens = flag_untrained(ids, mask) if masked else ids
    batch = assemble_contiguous_batch(
        tokens,
        boundaries,
        rows,
        mask_boundary_labels=boundary,
        labels_format=labels_format,
        masked=masked,
    )
    starts = [[0] + [p % window for p in boundaries if p // window == b and p % window]
              for b in range(rows)]  # fmt: skip
    inputs, labels, trained = reference(
        ids.reshape(rows, window).astype(np.int64),
        mask.reshape(rows, window),
        starts,
        [window] * rows,
        [boundary or masked] * rows,
        labels_format,
    )
    assert np.array_equal(batch["input_ids"], inputs)
    assert np.array_equal(batch["labels"], labels)
    assert batch["num_trained_tokens"] == trained


@pytest.mark.parametrize("pad_id", [0, 7, 2**31 - 1])
def test_masked_rows_any_padding_id(pad_id):
    # Masked rows are staged int32: every padding id StreamOptions allows fits (the widest
    # token dtype is int32; test_options_refuse_a_padding_id_beyond_int32).
    docs = [
        flag_untrained(np.array([11, 12, 13, 14, 15]), np.array([0, 0, 1, 1, 1], np.uint8)),
        flag_untrained(np.array([21, 22, 23, 24]), np.array([0, 1, 1, 1], np.uint8)),
    ]
    packer = GreedyPacker(ArrayDocuments(docs), 11, pad_id=pad_id, masked=True)
    (batch,) = take(Batcher(packer, 1), None)
    # A flagged row's inputs are its ids without the flag bit, padding included.
    pad = pad_id & 0x7FFFFFFF
    assert batch["input_ids"].tolist() == [[11, 12, 13, 14, 15, 21, 22, 23, 24, pad, pad]]
    assert batch["labels"].tolist() == [[-100, 13, 14, 15, -100, 22, 23, 24, -100, -100, -100]]
    assert batch["num_trained_tokens"] == 6


def test_options_refuse_a_padding_id_beyond_int32():
    from shardtok.errors import UsageError
    from shardtok.stream.options import StreamOptions

    StreamOptions(seq_len=8, batch_size=1, pad_id=2**31 - 1)
    with pytest.raises(UsageError, match="pad_id must be a token id at most 2,147,483,647"):
        StreamOptions(seq_len=8, batch_size=1, pad_id=2**31)


@pytest.mark.parametrize(("batch_size", "seq_len"), [(1, 1), (3, 5), (8, 2048)])
def test_a_batch_lives_in_one_block_of_memory(batch_size, seq_len):
    # One allocation per batch (see allocate_arrays): every array views the same block, none
    # overlaps another, and each has the shape and type the batch contract names.
    arrays = allocate_arrays(batch_size, seq_len)
    assert list(arrays) == list(BATCH_KEYS)
    grid = (batch_size, seq_len)
    want = {"input_ids": (grid, np.int64), "labels": (grid, np.int64),
            "position_ids": (grid, np.int64), "document_ids": (grid, np.int32),
            "cu_seqlens": ((batch_size * seq_len + 1,), np.int32),
            "source_ids": ((batch_size,), np.int64)}  # fmt: skip
    block = arrays["input_ids"].base
    assert block is not None and block.flags.owndata
    spans = []
    for key, array in arrays.items():
        shape, dtype = want[key]
        assert array.shape == shape and array.dtype == dtype, key
        assert array.flags.c_contiguous and array.flags.writeable, key
        assert array.base is block, key
        start = array.__array_interface__["data"][0]
        spans.append((start, start + array.nbytes, key))
    spans.sort()
    for (_, end, key), (start, _, after) in zip(spans, spans[1:]):
        assert end <= start, f"{key} overlaps {after}"
