"""The compiled segments kernel (shardtok/stream/_segments.c) against its numpy twin: the same
positions, document numbers, cu_seqlens and longest segment for any segment starts, and the
batches of whole streams unchanged by which of the two builds them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream import segments as segments_module
from shardtok.stream.segments import (
    contiguous_segments,
    contiguous_segments_python,
    fill_segments,
    fill_segments_numpy,
)

kernel = pytest.mark.skipif(
    segments_module._segments_kernel is None, reason="built without a C compiler: numpy path only"
)


def outputs(rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Filled with garbage: every element the contract names must be written.
    return (
        np.full((rows, seq_len), 7777, np.int64),
        np.full((rows, seq_len), -7777, np.int32),
        np.full(rows * seq_len + 1, 5555, np.int32),
    )


@kernel
@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 6),
    seq_len=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    inner=st.integers(0, 30),
    empty=st.booleans(),
)
def test_the_kernel_writes_what_numpy_writes(rows, seq_len, seed, inner, empty):
    rng = np.random.default_rng(seed)
    total = rows * seq_len
    # Every row starts a segment; documents begin inside rows; with `empty`, a start may repeat
    # (a segment of no token) and one may sit at the very end.
    starts = [r * seq_len for r in range(rows)]
    starts += rng.integers(0, total + (1 if empty else 0), inner).tolist()
    starts = sorted(starts if empty else set(starts))[:total]  # cu_seqlens holds total + 1
    local_ids = rng.integers(-3, 2**31 - 1, len(starts)).tolist()

    want = outputs(rows, seq_len)
    longest = fill_segments_numpy(list(starts), list(local_ids), *want)
    got = outputs(rows, seq_len)
    assert fill_segments(starts, local_ids, *got) == longest
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # What the twin means, spelled out for one token per segment start.
    positions, documents, cu = want
    n = len(starts)
    assert cu[:n].tolist() == starts and cu[n] == total and (cu[n + 1 :] == 5555).all()
    bounds = [*starts, total]
    for k in range(n):
        a, b = bounds[k], bounds[k + 1]
        assert positions.reshape(-1)[a:b].tolist() == list(range(b - a))
        assert (documents.reshape(-1)[a:b] == local_ids[k]).all()
    assert longest == max(b - a for a, b in zip(bounds, bounds[1:]))


@kernel
def test_the_kernel_refuses_what_it_cannot_read_and_writes_nothing_then():
    segments = segments_module._segments_kernel
    positions, documents, cu = outputs(2, 4)
    before = [a.copy() for a in (positions, documents, cu)]

    def untouched():
        for a, b in zip((positions, documents, cu), before):
            np.testing.assert_array_equal(a, b)

    for starts, match in (
        ([1, 4], "segment 0: start 1"),  # the first segment must start at 0
        ([0, 5, 3], "segment 2: start 3"),  # descending
        ([0, 9], "segment 1: start 9"),  # past the 8 tokens
    ):
        with pytest.raises(ValueError, match=match):
            segments(starts, [0] * len(starts), positions, documents, cu)
        untouched()
    with pytest.raises(ValueError, match="number 2147483648"):
        segments([0, 4], [0, 2**31], positions, documents, cu)
    with pytest.raises(ValueError, match="equally long"):
        segments([0, 4], [0], positions, documents, cu)
    with pytest.raises(ValueError, match="equally long"):
        segments([], [], positions, documents, cu)
    with pytest.raises(TypeError, match="position_ids"):
        segments([0], [0], positions.astype(np.int32), documents, cu)
    with pytest.raises(TypeError, match="document_ids"):
        segments([0], [0], positions, documents.astype(np.int64), cu)
    with pytest.raises(TypeError, match="cu_seqlens"):
        segments([0], [0], positions, documents, cu.astype(np.float32))
    with pytest.raises(ValueError, match="match position_ids"):
        segments([0], [0], positions, documents[:, :3].copy(), cu)
    with pytest.raises(ValueError, match="hold every start"):
        segments([0, 4], [0, 0], positions, documents, cu[:2].copy())
    with pytest.raises(ValueError, match="contiguous"):
        segments([0], [0], positions[:, ::2], documents[:, ::2], cu)
    untouched()


@kernel
@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 6),
    seq_len=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    documents=st.integers(0, 30),
    as_numpy=st.booleans(),
)
def test_the_contiguous_kernel_writes_what_python_writes(rows, seq_len, seed, documents, as_numpy):
    rng = np.random.default_rng(seed)
    window = seq_len + 1
    run = rows * window
    # Documents begin anywhere inside the run: mid-row, at a row start, at a row's last column.
    boundaries = sorted({int(p) for p in rng.integers(1, run, documents)} if run > 1 else set())
    given_boundaries = (
        np.array(boundaries, np.int64).tolist()
        if not as_numpy
        else list(np.array(boundaries, np.int64))
    )  # numpy's integers in a list are read too

    want = outputs(rows, seq_len)
    want_count, want_longest = contiguous_segments_python(boundaries, rows, *want)
    got = outputs(rows, seq_len)
    assert contiguous_segments(given_boundaries, rows, *got) == (want_count, want_longest)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # What the twin means: a segment per row and per document starting below the last column.
    inner = [p for p in boundaries if 0 < p % window < seq_len]
    starts = sorted([r * seq_len for r in range(rows)] + [p - p // window for p in inner])
    assert want_count == len(starts)
    assert want[2][:want_count].tolist() == starts and want[2][want_count] == rows * seq_len


@kernel
def test_the_contiguous_kernel_refuses_boundaries_outside_the_run():
    contiguous = segments_module._contiguous_kernel
    positions, documents, cu = outputs(2, 4)  # 2 rows of 5 tokens
    before = [a.copy() for a in (positions, documents, cu)]
    for boundaries, match in (
        ([0], "boundary 0: position 0"),
        ([3, 3], "boundary 1: position 3"),
        ([4, 2], "boundary 1: position 2"),
        ([10], "boundary 0: position 10"),
    ):
        with pytest.raises(ValueError, match=match):
            contiguous(boundaries, 2, positions, documents, cu)
    for a, b in zip((positions, documents, cu), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="rows x seq_len"):
        contiguous([], 3, positions, documents, cu)
    with pytest.raises(ValueError, match="every segment start"):
        contiguous([1, 2, 3], 2, positions, documents, cu[:4].copy())
    with pytest.raises(TypeError):
        contiguous([1.5], 2, positions, documents, cu)
    # row 0: [0, 1) [1, 2) [2, 3) [3, 4); row 1: [4, 5) [5, 8)
    assert contiguous([1, 2, 3, 6], 2, positions, documents, cu) == (6, 3)
    assert cu[:7].tolist() == [0, 1, 2, 3, 4, 5, 8]


@kernel
@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
def test_streams_are_the_same_with_either_path(tmp_path, monkeypatch, packing):
    from shardtok.stream.options import StreamOptions
    from shardtok.stream.slice_stream import SliceStream
    from tests.helpers.masked import Known
    from tests.helpers.numpy_batches import copies, same_batches

    known = Known([(n * 37) % 90 + 1 for n in range(120)])
    path = known.write(tmp_path / "d", masked=False, frame_size=256, shard_size=4000)
    options = StreamOptions(seq_len=31, batch_size=3, packing=packing, seed=5, interleave=2,
                            shuffle_buffer=7, bfd_window=5)  # fmt: skip

    compiled = copies(SliceStream(path, options))
    monkeypatch.setattr(segments_module, "_segments_kernel", None)
    monkeypatch.setattr(segments_module, "_contiguous_kernel", None)
    reference = copies(SliceStream(path, options))
    assert len(compiled) == len(reference) > 3
    same_batches(compiled, reference)
