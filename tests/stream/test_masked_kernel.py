"""The compiled masked-rows kernel (shardtok/stream/_rows.c: rows, flag) against its numpy twin:
the same inputs, labels and trained count on any flagged rows, and the batches of whole streams
unchanged by which of the two builds them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream import batch as batch_module
from shardtok.stream import masked as masked_module
from shardtok.stream import masked_rows as rows_module
from shardtok.stream.masked import flag_untrained, flag_untrained_numpy
from shardtok.stream.masked_rows import masked_rows as _masked_rows
from shardtok.stream.masked_rows import masked_rows_numpy as _masked_rows_numpy

kernel = pytest.mark.skipif(
    rows_module._rows_kernel is None, reason="built without a C compiler: numpy path only"
)


def outputs(rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    # Filled with garbage: every element must be written.
    return (np.full((rows, seq_len), 7777, np.int64), np.full((rows, seq_len), -7777, np.int64))


@kernel
@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 6),
    window=st.integers(2, 40),
    seed=st.integers(0, 2**32 - 1),
    untrained_share=st.sampled_from([0.0, 0.3, 1.0]),
    boundaries=st.integers(0, 12),
    labels_format=st.sampled_from(["shifted", "hf"]),
    padding=st.booleans(),
)
def test_the_kernel_writes_what_numpy_writes(
    rows, window, seed, untrained_share, boundaries, labels_format, padding
):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 2**31 - 1, (rows, window), dtype=np.int32, endpoint=True)
    tokens[rng.random((rows, window)) < 0.2] = 0
    tokens[rng.random((rows, window)) < 0.2] = 2**31 - 1 - rng.integers(0, 120)  # near the flag
    mask = (rng.random((rows, window)) >= untrained_share).astype(np.uint8)
    grid = flag_untrained(tokens.reshape(-1), mask.reshape(-1)).reshape(rows, window)
    # Targets that begin a document: distinct flat positions, never in column 0.
    candidates = [p for p in range(rows * window) if p % window]
    chosen = rng.choice(candidates, min(boundaries, len(candidates)), replace=False)
    ignored = sorted(chosen.tolist())
    # Padded rows as the packers give them: (row, first padding column, at least 1).
    padded = (
        [(b, int(rng.integers(1, window + 1))) for b in range(rows) if rng.random() < 0.5]
        if padding
        else []
    )
    want_in, want_lab = outputs(rows, window - 1)
    want = _masked_rows_numpy(want_in, want_lab, grid, ignored, labels_format, padded)
    got_in, got_lab = outputs(rows, window - 1)
    got = _masked_rows(got_in, got_lab, grid, ignored, labels_format, padded)
    np.testing.assert_array_equal(got_in, want_in)
    np.testing.assert_array_equal(got_lab, want_lab)
    targets = want_lab.size - (rows if labels_format == "hf" else 0)
    untrained = int(np.count_nonzero(want_lab == -100)) - (rows if labels_format == "hf" else 0)
    assert got == want == targets - untrained
    # and the labels are the targets' ids or -100, never another negative value
    assert not np.any((want_lab < 0) & (want_lab != -100))


@kernel
def test_the_kernel_refuses_what_it_cannot_read():
    kernel_rows = rows_module._rows_kernel
    grid = np.zeros((2, 5), np.int32)
    inputs, labels = outputs(2, 4)

    def rows(*arrays, pad=None, ignored=None):
        return kernel_rows(*arrays, pad, False, ignored or [])

    assert rows(grid, inputs, labels) == 0
    with pytest.raises(TypeError, match="grid"):
        rows(grid.astype(np.int64), inputs, labels)
    with pytest.raises(TypeError, match="input_ids"):
        rows(grid, inputs.astype(np.int32), labels)
    with pytest.raises(ValueError, match=r"\[B, W - 1\]"):
        rows(grid, inputs[:, :3].copy(), labels)
    with pytest.raises(ValueError, match="contiguous"):
        rows(grid[:, ::2], inputs[:, :2].copy(), labels[:, :2].copy())  # not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        rows(grid, inputs, np.asfortranarray(labels))  # Fortran order is refused too
    with pytest.raises(TypeError, match="pad"):
        rows(grid, inputs, labels, pad=np.zeros(3, np.int64))
    with pytest.raises(TypeError, match="pad"):
        rows(grid, inputs, labels, pad=np.zeros(2, np.float64))  # 8 bytes, but no integers
    for outside in (0, 5, 10, -1):  # column 0 (an input only) or no position of the grid
        with pytest.raises(ValueError, match=f"ignored position {outside} "):
            rows(grid, inputs, labels, ignored=[outside])


@kernel
@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
@pytest.mark.parametrize("labels_format", ["shifted", "hf"])
def test_streams_are_the_same_with_either_path(tmp_path, monkeypatch, packing, labels_format):
    from shardtok.stream.options import StreamOptions
    from shardtok.stream.slice_stream import SliceStream
    from tests.helpers.masked import Known
    from tests.helpers.numpy_batches import copies, same_batches

    known = Known([(n * 37) % 90 + 1 for n in range(120)])
    path = known.write(tmp_path / "d", masked=True, frame_size=256, shard_size=4000)
    options = StreamOptions(seq_len=31, batch_size=3, packing=packing, seed=5, interleave=2,
                            labels_format=labels_format, shuffle_buffer=7, bfd_window=5)  # fmt: skip

    compiled = copies(SliceStream(path, options))
    monkeypatch.setattr(rows_module, "_rows_kernel", None)
    monkeypatch.setattr(masked_module, "_flag_kernel", None)
    monkeypatch.setattr(batch_module, "_contiguous_kernel", None)  # concat's rows
    reference = copies(SliceStream(path, options))
    assert len(compiled) == len(reference) > 3
    same_batches(compiled, reference)


@kernel
@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 300),
    dtype=st.sampled_from([np.uint8, np.uint16, np.int32, np.uint32]),
    seed=st.integers(0, 2**32 - 1),
    trained_share=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_the_flag_kernel_writes_what_numpy_writes(size, dtype, seed, trained_share):
    assert masked_module._flag_kernel is not None
    rng = np.random.default_rng(seed)
    high = min(np.iinfo(dtype).max, 2**31 - 1)
    tokens = rng.integers(0, high, size, endpoint=True).astype(dtype)
    mask = (rng.random(size) < trained_share).astype(np.uint8)
    got = flag_untrained(tokens, mask)
    want = flag_untrained_numpy(tokens, mask)
    assert got.dtype == want.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    # and what the flag means: negative exactly where the mask is 0, the id under it
    np.testing.assert_array_equal(got < 0, mask == 0)
    np.testing.assert_array_equal(got & 0x7FFFFFFF, tokens.astype(np.int64))


@kernel
def test_the_flag_kernel_refuses_what_it_cannot_read():
    flag = masked_module._flag_kernel
    tokens, mask, out = np.arange(4, dtype=np.int32), np.ones(4, np.uint8), np.empty(4, np.int32)
    flag(tokens, mask, out)
    np.testing.assert_array_equal(out, tokens)
    with pytest.raises(TypeError, match="int32 out"):
        flag(tokens.astype(np.int64), mask, out)
    with pytest.raises(TypeError, match="int32 out"):
        flag(tokens, mask.astype(np.int8), out)
    with pytest.raises(TypeError, match="int32 out"):
        flag(tokens, mask, out.astype(np.int64))
    with pytest.raises(ValueError, match="as long"):
        flag(tokens[:3].copy(), mask, out)
    with pytest.raises(ValueError, match="contiguous"):
        flag(tokens[::2], mask[::2], out[:2])
    # numpy's path takes what the kernel does not: int64 ids, strided arrays
    np.testing.assert_array_equal(
        flag_untrained(tokens.astype(np.int64)[::2], mask[::2]), np.array([0, 2], np.int32)
    )


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(0, 300),
    dtype=st.sampled_from([np.uint8, np.uint16, np.int32, np.uint32]),
    seed=st.integers(0, 2**32 - 1),
    writable=st.booleans(),
    compiled=st.booleans(),
)
def test_a_frame_is_flagged_in_place_where_it_can_be(size, dtype, seed, writable, compiled):
    from shardtok.stream.masked import flag_frame

    if compiled and masked_module._flag_kernel is None:
        return
    rng = np.random.default_rng(seed)
    high = min(np.iinfo(dtype).max, 2**31 - 1)
    tokens = rng.integers(0, high, size, endpoint=True).astype(dtype)
    tokens.flags.writeable = writable
    mask = (rng.random(size) < 0.5).astype(np.uint8)
    want = flag_untrained_numpy(tokens, mask)
    kernel_before = masked_module._flag_kernel
    try:
        if not compiled:
            masked_module._flag_kernel = None
        got = flag_frame(tokens, mask)
    finally:
        masked_module._flag_kernel = kernel_before
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    in_place = writable and np.dtype(dtype).itemsize == 4
    assert np.shares_memory(got, tokens) == (in_place and size > 0)


@kernel
def test_the_flag_kernel_writes_in_place_or_apart_never_across():
    flag = masked_module._flag_kernel
    tokens = np.arange(8, dtype=np.int32)
    mask = np.array([1, 0] * 4, np.uint8)
    flag(tokens, mask, tokens)  # the very buffer: in place
    np.testing.assert_array_equal(tokens < 0, mask == 0)
    np.testing.assert_array_equal(tokens & 0x7FFFFFFF, np.arange(8))
    wide = np.arange(16, dtype=np.uint16)
    with pytest.raises(ValueError, match="overlap"):
        flag(wide[:8], mask, wide.view(np.int32))  # 2-byte tokens under their own output
    with pytest.raises(ValueError, match="overlap"):
        shifted = np.arange(9, dtype=np.int32)
        flag(shifted[1:], mask, shifted[:8])  # in part
