"""ConcatTokens.ranges / paired_ranges and read_ranges: the slices of one array, whatever the
ranges (empty, at the very end, across arrays) and whether given as lists or int64 arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.memmap.samples import read_paired_ranges, read_ranges
from shardtok.memmap.tokens import ConcatTokens


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    data=st.data(),
    as_arrays=st.booleans(),
)
def test_ranges_are_the_slices_of_one_array(lengths, data, as_arrays):
    arrays = [np.arange(sum(lengths[:i]), sum(lengths[: i + 1]), dtype=np.int32)
              for i in range(len(lengths))]  # fmt: skip
    whole = np.concatenate(arrays)
    n = len(whole)
    begins = data.draw(st.lists(st.integers(0, n), max_size=12))
    sizes = [data.draw(st.integers(0, n - b)) for b in begins]
    want = [whole[b : b + k] for b, k in zip(begins, sizes) if k]
    given_as = (np.array(begins, dtype=np.int64), np.array(sizes, dtype=np.int64)) if as_arrays \
        else (begins, sizes)  # fmt: skip
    virtual = ConcatTokens(arrays)
    masks = ConcatTokens([a.astype(np.uint8) % 2 for a in arrays])
    for got in (virtual.ranges(*given_as), read_ranges(virtual, *given_as),
                read_ranges(whole, *given_as)):  # fmt: skip
        assert len(got) == len(want)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    tokens, mask = read_paired_ranges(virtual, masks, *given_as)
    assert all(np.array_equal(g, w) for g, w in zip(tokens, want))
    assert all(np.array_equal(m, w.astype(np.uint8) % 2) for m, w in zip(mask, want))
