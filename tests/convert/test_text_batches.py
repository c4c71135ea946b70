"""A worker's text batches: texts taken a run at a time (TextBatcher.extend, the JSONL fast
path) are cut into exactly the batches that adding them one by one gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.worker import unit_batches
from shardtok.convert.worker.unit_batches import TextBatcher


class _Encoder:
    def __init__(self):
        self.batches: list[list[str]] = []

    def encode(self, texts):
        self.batches.append(list(texts))
        sizes = np.fromiter(map(len, texts), dtype=np.int32, count=len(texts))
        return np.zeros(int(sizes.sum()), np.uint16), sizes


class _Sink:
    def submit(self, job) -> None:  # the writes are not what is compared
        pass


def _batches(runs: list[list[str]], whole: bool) -> list[list[str]]:
    encoder = _Encoder()
    batcher = TextBatcher(encoder, None, None, _Sink())
    for run in runs:
        if whole:
            batcher.extend(run)
        else:
            for text in run:
                batcher.add(text)
    batcher.flush()
    return encoder.batches


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(st.lists(st.integers(1, 40).map(lambda n: "x" * n), max_size=30), max_size=8),
    chars=st.integers(1, 120),
    docs=st.integers(1, 9),
)
def test_extend_cuts_the_batches_add_cuts(runs, chars, docs):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit_batches, "_BATCH_CHARS", chars)
        patch.setattr(unit_batches, "_BATCH_DOCS", docs)
        by_one = _batches(runs, whole=False)
        assert _batches(runs, whole=True) == by_one
    assert sum(by_one, []) == sum(runs, [])
    assert all(len(b) <= docs for b in by_one)


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.integers(0, 2),  # piece
            st.integers(1, 30),  # first record
            st.integers(0, 4),  # records in the run; 0 with `single`: one record
            st.booleans(),  # single: added with add(), not add_run()
        ),
        max_size=20,
    )
)
def test_doc_rows_are_one_row_per_document_in_order(entries):
    rows = unit_batches.DocRows()
    expected = []
    for piece, first, n, single in entries:
        if single:
            rows.add(piece, first)
            expected.append((piece, first))
        else:
            rows.add_run(piece, range(first, first + n))
            expected.extend((piece, r) for r in range(first, first + n))
    docs = np.full((rows.count, 3), -1, dtype=np.int64)
    rows.fill(docs)
    assert rows.count == len(expected)
    assert [tuple(r) for r in docs[:, :2].tolist()] == expected
    assert (docs[:, 2] == -1).all()  # the sizes' column is the caller's
