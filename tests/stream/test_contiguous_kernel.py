"""The compiled rows of a contiguous batch (shardtok/stream/_rows.c: contiguous), read straight
from the pieces of its documents, against its twin (`contiguous_rows_numpy`: concatenate, then
the grid's copies): the same inputs, labels and trained count for any split of the run into
pieces, any id type, masked or not; None (nothing written) for pieces it does not read; and the
batches of whole streams unchanged by which of the two builds them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream import batch as batch_module
from shardtok.stream.batch import contiguous_rows_numpy
from shardtok.stream.masked import flag_untrained
from tests.stream.test_masked_kernel import outputs

kernel = pytest.mark.skipif(
    batch_module._contiguous_kernel is None,
    reason="built without a C compiler: numpy path only",
)


def split(run: np.ndarray, rng: np.random.Generator, cuts: int) -> list[np.ndarray]:
    """`run` as consecutive views, some of them empty, cut anywhere (row ends included)."""
    at = np.sort(rng.integers(0, len(run) + 1, cuts))
    return [run[a:b] for a, b in zip([0, *at.tolist()], [*at.tolist(), len(run)])]


@kernel
@settings(max_examples=400, deadline=None)
@given(
    rows=st.integers(1, 6),
    window=st.integers(2, 40),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.uint8, np.uint16, np.int32, np.uint32, np.int64, "flagged"]),
    cuts=st.integers(0, 30),
    boundaries=st.integers(0, 12),
    labels_format=st.sampled_from(["shifted", "hf"]),
)
def test_the_kernel_writes_what_its_twin_writes(
    rows, window, seed, dtype, cuts, boundaries, labels_format
):
    rng = np.random.default_rng(seed)
    masked = dtype == "flagged"
    n = rows * window
    if masked:
        ids = rng.integers(0, 2**31 - 1, n, dtype=np.int32, endpoint=True)
        ids[rng.random(n) < 0.2] = 2**31 - 1 - rng.integers(0, 120)  # near the flag
        run = flag_untrained(ids, (rng.random(n) < 0.6).astype(np.uint8))
    else:
        high = min(np.iinfo(dtype).max, 2**31 - 1)
        run = rng.integers(0, high, n, endpoint=True).astype(dtype)
    # Where documents begin: distinct run positions, never a row's column 0.
    candidates = [p for p in range(n) if p % window]
    starts = sorted(
        rng.choice(candidates, min(boundaries, len(candidates)), replace=False).tolist()
    )
    hf = labels_format == "hf"

    want_in, want_lab = outputs(rows, window - 1)
    want = contiguous_rows_numpy([run], want_in, want_lab, starts, labels_format, masked)
    got_in, got_lab = outputs(rows, window - 1)
    # The kernel takes the packer's boundaries as they are: documents starting a row too.
    boundaries = sorted(starts + [b * window for b in range(1, rows) if rng.random() < 0.5])
    untrained = batch_module._contiguous_kernel(
        split(run, rng, cuts), got_in, got_lab, hf, masked, boundaries
    )
    np.testing.assert_array_equal(got_in, want_in)
    np.testing.assert_array_equal(got_lab, want_lab)
    targets = want_lab.size - (rows if hf else 0)
    assert targets - untrained == want
    assert want == targets - (int(np.count_nonzero(want_lab == -100)) - (rows if hf else 0))


@kernel
def test_the_kernel_leaves_to_its_twin_what_it_does_not_read():
    contiguous = batch_module._contiguous_kernel
    run = np.arange(10, dtype=np.int32)
    inputs, labels = outputs(2, 4)
    untouched = inputs.copy(), labels.copy()
    for pieces, masked in [
        ([run[:4], run[4:].astype(np.int64)], False),  # two id types: numpy casts them
        ([run[::2], run[::2]], False),  # not contiguous
        ([run.astype(np.float32)], False),  # not ids
        ([run.astype(np.int16)], False),  # not a stored id type
        ([run.reshape(2, 5)], False),  # not 1-D
        ([run.astype(np.uint16)], True),  # flags live in int32 only
    ]:
        assert contiguous(pieces, inputs, labels, False, masked, []) is None
        np.testing.assert_array_equal(inputs, untouched[0])
        np.testing.assert_array_equal(labels, untouched[1])
    # a list of something without a buffer is left to the twin as well
    assert contiguous([object()], inputs, labels, False, False, []) is None


@kernel
def test_the_kernel_refuses_what_cannot_be_a_batch():
    contiguous = batch_module._contiguous_kernel
    run = np.arange(10, dtype=np.int32)
    inputs, labels = outputs(2, 4)
    assert contiguous([run[:3], run[3:]], inputs, labels, False, False, []) == 0
    np.testing.assert_array_equal(inputs, [[0, 1, 2, 3], [5, 6, 7, 8]])
    np.testing.assert_array_equal(labels, [[1, 2, 3, 4], [6, 7, 8, 9]])
    with pytest.raises(ValueError, match="the pieces hold 9 tokens, the rows 10"):
        contiguous([run[:9]], inputs, labels, False, False, [])
    with pytest.raises(ValueError, match="the pieces hold 0 tokens"):
        contiguous([], inputs, labels, False, False, [])
    with pytest.raises(TypeError, match="input_ids"):
        contiguous([run], inputs.astype(np.int32), labels, False, False, [])
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        contiguous([run], inputs, labels[:, :3].copy(), False, False, [])
    for outside in (10, -1, 11):  # off the run
        with pytest.raises(ValueError, match=f"ignored position {outside} "):
            contiguous([run], inputs, labels, False, False, [outside])
    # a document starting a row (column 0) has no target before it: passed over
    assert contiguous([run], inputs, labels, False, False, [0, 5]) == 0
    assert contiguous([run], inputs, labels, False, False, [0, 3, 5]) == 1
    np.testing.assert_array_equal(labels, [[1, 2, -100, 4], [6, 7, 8, 9]])
    # numpy's integers are positions too (a packer may hand over a list of them)
    assert contiguous([run], inputs, labels, False, False, [np.int64(3), np.int32(7)]) == 2


@kernel
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("labels_format", ["shifted", "hf"])
def test_streams_are_the_same_with_either_path(tmp_path, monkeypatch, masked, labels_format):
    from shardtok.stream.options import StreamOptions
    from shardtok.stream.slice_stream import SliceStream
    from tests.helpers.masked import Known
    from tests.helpers.numpy_batches import copies, same_batches

    known = Known([(n * 37) % 90 + 1 for n in range(120)])
    path = known.write(tmp_path / "d", masked=masked, frame_size=256, shard_size=4000)
    options = StreamOptions(seq_len=31, batch_size=3, packing="concat", seed=5, interleave=2,
                            labels_format=labels_format, shuffle_buffer=7,
                            mask_boundary_labels=True)  # fmt: skip

    compiled = copies(SliceStream(path, options))
    monkeypatch.setattr(batch_module, "_contiguous_kernel", None)
    reference = copies(SliceStream(path, options))
    assert len(compiled) == len(reference) > 3
    same_batches(compiled, reference)
