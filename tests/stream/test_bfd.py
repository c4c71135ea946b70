"""Best-fit-decreasing packing: conservation, boundaries, efficiency, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.batch import IGNORE_INDEX
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.bfd import BFDPacker, pack_bfd
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.options import HISTORY, StreamOptions
from shardtok.stream.resume.fingerprint import fingerprint_differences
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.save_restore import check_save_restore
from shardtok.testing.synthetic import write_synthetic_dataset


def documents(lengths, first: int = 0) -> list[np.ndarray]:
    """Documents whose tokens are all distinct (token = global position + first)."""
    docs, at = [], first
    for n in lengths:
        docs.append(np.arange(at, at + n, dtype=np.int32))
        at += n
    return docs


def make_packer(kind: str, docs, seq_len: int, size: int):
    if kind == "bfd":
        return BFDPacker(ArrayDocuments(docs), seq_len, bfd_window=size)
    return GreedyPacker(ArrayDocuments(docs), seq_len, lookahead=size)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), max_size=50),
    seq_len=st.integers(1, 24),
    size=st.integers(1, 9),
    kind=st.sampled_from(["greedy", "bfd"]),
)
def test_packing_loses_and_duplicates_no_token_and_keeps_segments_in_one_document(
    lengths, seq_len, size, kind
):
    docs = documents(lengths)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    slots = seq_len + 1
    seqs = take(make_packer(kind, docs, seq_len, size), None)
    total = sum(lengths)
    real = [s.tokens[: s.length] for s in seqs]
    got = np.sort(np.concatenate(real)) if real else np.empty(0, np.int32)
    assert np.array_equal(got, np.arange(total, dtype=np.int32))  # each (doc, offset) once
    assert len(seqs) >= -(-total // slots)  # the plan's lower bound
    for s in seqs:
        assert len(s.tokens) == slots and 1 <= s.length <= slots
        assert (s.tokens[s.length :] == 0).all()
        bounds = [*s.starts, s.length]
        assert bounds[0] == 0 and all(a < b for a, b in zip(bounds, bounds[1:]))
        for a, b in zip(bounds, bounds[1:]):
            piece = s.tokens[a:b]
            assert np.array_equal(piece, np.arange(piece[0], piece[0] + len(piece)))
            assert len(set(doc_of[piece].tolist())) == 1  # a segment never crosses documents


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=40), size=st.integers(1, 12))
def test_bfd_batches_label_no_target_across_documents(lengths, size):
    docs = documents(lengths, first=1)  # 0 is padding
    doc_of = {int(t): i for i, d in enumerate(docs) for t in d}
    packer = BFDPacker(ArrayDocuments(docs), 15, bfd_window=size)
    for batch in Batcher(packer, 2, mask_boundary_labels=True):
        for row in range(len(batch["input_ids"])):
            x, y = batch["input_ids"][row], batch["labels"][row]
            pos = batch["position_ids"][row]
            for i in range(len(x)):
                if x[i] and (i == 0 or doc_of.get(int(x[i - 1])) != doc_of[int(x[i])]):
                    assert pos[i] == 0  # position_ids restart at every document
                if y[i] != IGNORE_INDEX:
                    assert x[i] and doc_of[int(x[i])] == doc_of[int(y[i])]


def test_pack_bfd_is_best_fit_decreasing_with_position_ties():
    # slots 10: 7 opens A, 6 opens B, 4 fills B, 3 fills A, 2 opens C; emitted by first piece
    bins = pack_bfd([3, 7, 2, 6, 4], 10)
    assert bins == [[(0, 0, 3), (1, 0, 7)], [(2, 0, 2)], [(3, 0, 6), (4, 0, 4)]]
    # a long document: full pieces of their own, the remainder packed with the rest
    assert pack_bfd([25, 5], 10) == [[(0, 0, 10)], [(0, 10, 20)], [(0, 20, 25), (1, 0, 5)]]
    assert pack_bfd([0, 0], 10) == []


def test_bfd_beats_greedy_and_window_one_is_one_document_per_sequence():
    rng = np.random.default_rng(0)
    docs = documents(rng.integers(1, 300, size=600))

    def efficiency(packer):
        seqs = take(packer, None)
        return sum(s.length for s in seqs) / (len(seqs) * 256)

    greedy = efficiency(GreedyPacker(ArrayDocuments(docs), 255))
    bfd = efficiency(BFDPacker(ArrayDocuments(docs), 255, bfd_window=200))
    assert bfd > greedy and bfd > 0.95
    ones = take(BFDPacker(ArrayDocuments(docs), 255, bfd_window=1), None)
    assert len(ones) == sum(-(-len(d) // 256) for d in docs)  # a long one: its pieces alone
    assert all(len(s.starts) == 1 for s in ones)


@pytest.mark.parametrize("size", [1, 3, 8, 50])
def test_bfd_save_restore_over_documents(size):
    lengths = np.random.default_rng(size).integers(0, 40, size=120).tolist()
    lengths[30] = 200  # several full sequences
    docs = documents(lengths)
    check_save_restore(
        lambda: BFDPacker(ArrayDocuments(docs), 23, bfd_window=size, pad_id=5),
        midpoints=(0, 1, 2, 3, 5, 7, 16, 33, -3, -2, -1),
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("bfd")
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 120, size=300)]
    lengths[50] = 900
    write_synthetic_dataset(
        path, lengths=lengths, vocab_size=1 << 24, unique_tokens=True, first_token=1,
        shard_size=2500, frame_size=700,
    )  # fmt: skip
    return str(path)


@pytest.mark.parametrize("shuffle", [0, 25])
def test_bfd_slice_stream_save_restore(dataset, shuffle):
    options = StreamOptions(
        seq_len=47, batch_size=2, packing="bfd", bfd_window=13, shuffle_buffer=shuffle,
        mask_boundary_labels=True,
    )  # fmt: skip
    check_save_restore(
        lambda: SliceStream(dataset, options, epoch=1, rank=1, world_size=2),
        midpoints=(0, 1, 2, 5, 9, 30, 77, -2, -1),
    )


def test_bfd_state_is_small_and_strict(dataset):
    options = StreamOptions(seq_len=47, batch_size=2, packing="bfd", bfd_window=13)
    stream = SliceStream(dataset, options)
    take(stream, 3)
    state = stream.state_dict()
    packer = state["batcher"]["upstream"]
    assert packer["kind"] == "bfd" and packer["window"] == 13 and packer["slots"] == 48
    for bad in ({"done": -1}, {"window": HISTORY + 1}, {"extra": 1}, {"done": 10**6}):
        with pytest.raises(ResumeStateError):
            BFDPacker.parse_state({**packer, **bad})
    other = StreamOptions(seq_len=47, batch_size=2, packing="bfd", bfd_window=14)
    with pytest.raises(ResumeStateError):
        SliceStream(dataset, other).reset(state)


def test_bfd_window_is_checked():
    with pytest.raises(UsageError, match="bfd_window must be at most"):
        StreamOptions(seq_len=8, batch_size=1, packing="bfd", bfd_window=HISTORY + 1)
    with pytest.raises(UsageError):
        StreamOptions(seq_len=8, batch_size=1, bfd_window=0)
    StreamOptions(seq_len=8, batch_size=1, packing="bfd", bfd_window=HISTORY)


def test_fingerprint_saved_without_a_new_option_compares_as_its_default():
    current = {"sources": [], "options": StreamOptions(seq_len=8, batch_size=1).to_dict()}
    saved = {"sources": [], "options": dict(current["options"])}
    del saved["options"]["bfd_window"]
    assert fingerprint_differences(saved, current) == []
    changed = {"sources": [], "options": {**current["options"], "bfd_window": 7}}
    assert fingerprint_differences(saved, changed) == ["option bfd_window: 1000 saved, 7 now"]
