"""SliceReader takes documents in runs (whole round-robin rounds at once, frames as lists): the
same documents in the same order as the per-document round robin it replaced, for every
interleave, slice, resume point and request size."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.dataset.source import DatasetSource
from shardtok.format import ShardReader
from shardtok.stream.masked import flag_untrained
from shardtok.stream.nodes.reader import SliceReader, round_robin_consumed
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import epoch_plan
from tests.helpers.masked import Known


def piece_documents(path: Path, piece, masked: bool) -> list[np.ndarray]:
    """A piece's documents read by random access and trimmed to its token range."""
    reader = ShardReader(path / piece.file)
    offsets = reader.offsets
    first = int(np.searchsorted(offsets, piece.start, side="right")) - 1
    stop = int(np.searchsorted(offsets, piece.stop, side="left"))
    out = []
    for d in range(first, stop):
        doc = reader.document(d)
        if masked:
            doc = flag_untrained(doc, reader.document_mask(d))
        lo = max(piece.start - int(offsets[d]), 0)
        hi = min(piece.stop - int(offsets[d]), len(doc))
        out.append(doc[lo:hi])
    return out


def reference(path: Path, pieces, interleave: int, masked: bool) -> list[list[np.ndarray]]:
    """Per group, its documents in the per-document round robin."""
    groups = []
    for g in range(0, len(pieces), interleave):
        docs = [piece_documents(path, p, masked) for p in pieces[g : g + interleave]]
        order, at = [], [0] * len(docs)
        while any(a < len(d) for a, d in zip(at, docs)):
            for i, d in enumerate(docs):
                if at[i] < len(d):
                    order.append(d[at[i]])
                    at[i] += 1
        groups.append(order)
    return groups


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 150), min_size=10, max_size=90),
    masked=st.booleans(),
    interleave=st.integers(1, 5),
    workers=st.integers(1, 3),
    requests=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    resume=st.floats(0, 1),
)
def test_runs_follow_the_round_robin(lengths, masked, interleave, workers, requests, resume):
    with tempfile.TemporaryDirectory() as tmp:
        path = Known(lengths).write(Path(tmp) / "d", masked=masked, frame_size=96, shard_size=700)
        source = DatasetSource.of(path)
        options = StreamOptions(seq_len=7, batch_size=1, shuffle_buffer=0, interleave=interleave)
        plan = epoch_plan(source.manifest, seq_len=7, batch_size=1, seed=0, epoch=0,
                          world_size=1, num_workers=workers, packing="concat",
                          overlong="split")  # fmt: skip
        for s in plan.slices:
            groups = reference(path, s.pieces, options.interleave, masked)
            want = [d for g in groups for d in g]
            # resume inside a group: its ordinal, as a saved state would give it
            start = int(resume * len(want))
            group, ordinal, before = 0, start, 0
            while group < len(groups) and ordinal >= len(groups[group]) and groups[group]:
                ordinal -= len(groups[group])
                before += len(groups[group])
                group += 1
            reader = SliceReader(source, s.pieces, interleave, masked)
            reader.reset(None)
            reader.reset(reader._wrap(group=group, ordinal=ordinal, position=start))
            got, k = [], 0
            while True:
                docs = reader._next_many(requests[k % len(requests)])
                k += 1
                got += docs
                if not docs:
                    break
            assert len(got) == len(want) - start
            for a, b in zip(got, want[start:]):
                np.testing.assert_array_equal(a, b)
            reader.close()


def test_round_robin_consumed_matches_the_rotation():
    counts = [3, 0, 5, 1]
    order = []
    at = [0] * len(counts)
    while any(a < c for a, c in zip(at, counts)):
        for i, c in enumerate(counts):
            if at[i] < c:
                order.append(i)
                at[i] += 1
    for ordinal in range(len(order) + 1):
        taken, _ = round_robin_consumed(counts, ordinal)
        assert taken == [order[:ordinal].count(i) for i in range(len(counts))]


def test_a_reader_that_ends_early_is_an_error_naming_the_shard_not_a_short_slice():
    import pytest

    from shardtok.errors import CorruptShardError
    from shardtok.stream.nodes.reader import _OpenPiece
    from shardtok.stream.plan import Piece

    class Short:  # a stand-in reader whose documents stop one short of its offsets
        where, mask_source = "ds/shard-000000.tar", None
        offsets = np.array([0, 3, 6, 9])

        def documents(self, start, stop, with_masks=False):
            return iter([np.arange(3)] * (stop - start - 1))

    class Source:
        def open_stream(self, name, with_masks=False):
            return Short(), None

    piece = _OpenPiece(Source(), Piece(0, "shard-000000.tar", 0, 9), 9)
    piece.start(0)
    assert len(piece.take(2)) == 2
    with pytest.raises(
        CorruptShardError, match="shard-000000.tar.*documents end at 2, the piece reads to 3"
    ):
        piece.take(1)
