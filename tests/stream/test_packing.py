"""Concat and greedy packing: token conservation, lengths, boundaries, note 004, save/restore."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.plan import concat_window_count
from shardtok.testing.save_restore import check_save_restore

# Reference note 004: the 137 token ids of its example text.
NOTE_004_TOKENS = [43, 80, 223, 86, 74, 71, 223, 74, 71, 10469, 86, 223, 81, 72, 223, 86, 74, 71, 223, 69, 14600, 91, 223, 85, 86, 81, 81, 70, 223, 86, 74, 71, 223, 81, 78, 70, 223, 23806, 29948, 10469, 91, 14, 223, 67, 223, 84, 20999, 75, 69, 223, 72, 84, 9162, 223, 67, 223, 68, 91, 73, 5574, 71, 223, 13757, 67, 16, 223, 43, 86, 85, 223, 85, 86, 5574, 71, 223, 89, 67, 78, 78, 85, 223, 68, 15761, 71, 223, 86, 74, 71, 223, 79, 10469, 77, 85, 223, 81, 72, 223, 86, 29684, 71, 14, 223, 12956, 70, 223, 75, 88, 91, 223, 69, 78, 87, 80, 73, 223, 86, 75, 73, 74, 86, 78, 91, 223, 86, 81, 223, 14600, 85, 223, 72, 67, 69, 67, 70, 71, 223, 4740]  # fmt: skip


def unique_documents(lengths) -> list[np.ndarray]:
    """Documents whose tokens are all distinct (token = global position), so coverage is exact."""
    docs, at = [], 0
    for n in lengths:
        docs.append(np.arange(at, at + n, dtype=np.int32))
        at += n
    return docs


def pairs(seq) -> tuple[list[int], list[int]]:
    return seq.tokens[:-1].tolist(), seq.tokens[1:].tolist()


def test_note_004_sliding_windows_stride_1():
    docs = [np.array(NOTE_004_TOKENS, dtype=np.uint16)]
    windows = take(ConcatPacker(ArrayDocuments(docs), seq_len=4, stride=1), 5)
    assert [pairs(w) for w in windows] == [
        ([43, 80, 223, 86], [80, 223, 86, 74]),
        ([80, 223, 86, 74], [223, 86, 74, 71]),
        ([223, 86, 74, 71], [86, 74, 71, 223]),
        ([86, 74, 71, 223], [74, 71, 223, 74]),
        ([74, 71, 223, 74], [71, 223, 74, 71]),
    ]


def test_note_004_stride_equal_to_context_is_megatron_overlap():
    docs = [np.array(NOTE_004_TOKENS, dtype=np.uint16)]
    packer = ConcatPacker(ArrayDocuments(docs), seq_len=4, stride=4)
    windows = take(packer, None)
    t = NOTE_004_TOKENS
    expected = [(t[i : i + 4], t[i + 1 : i + 5]) for i in range(0, len(t) - 4, 4)]
    assert [pairs(w) for w in windows] == expected
    # The note's PretrainDataset loop count equals the plan's formula.
    assert len(windows) == concat_window_count(len(t), 4, 4) == len(range(0, len(t) - 4, 4))


lengths_st = st.lists(st.integers(0, 40), min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, seq_len=st.integers(1, 24), data=st.data())
def test_concat_conserves_tokens_and_boundaries(lengths, seq_len, data):
    stride = data.draw(st.integers(1, seq_len + 1))
    docs = unique_documents(lengths)
    stream = np.concatenate(docs) if docs else np.empty(0, np.int32)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    windows = take(ConcatPacker(ArrayDocuments(docs), seq_len, stride), None)
    assert len(windows) == concat_window_count(len(stream), seq_len, stride)
    for i, w in enumerate(windows):
        assert len(w.tokens) == seq_len + 1 and w.length == seq_len + 1
        assert np.array_equal(w.tokens, stream[i * stride : i * stride + seq_len + 1])
        owners = doc_of[i * stride : i * stride + seq_len + 1]
        expected_starts = [0] + [j for j in range(1, seq_len + 1) if owners[j] != owners[j - 1]]
        assert w.starts == expected_starts
    if stride == seq_len + 1 and windows:  # disjoint windows: no token twice, none skipped
        used = np.concatenate([w.tokens for w in windows])
        assert np.array_equal(used, stream[: len(used)])


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, seq_len=st.integers(1, 24), lookahead=st.integers(1, 5))
def test_greedy_conserves_tokens_and_keeps_documents_whole(lengths, seq_len, lookahead):
    docs = unique_documents(lengths)
    window = seq_len + 1
    seqs = take(GreedyPacker(ArrayDocuments(docs), seq_len, lookahead=lookahead, pad_id=0), None)
    real = [s.tokens[: s.length] for s in seqs]
    total = sum(len(d) for d in docs)
    # Every token exactly once (tokens are unique), nothing lost, nothing duplicated.
    got = np.sort(np.concatenate(real)) if real else np.empty(0, np.int32)
    assert np.array_equal(got, np.arange(total, dtype=np.int32))
    assert len(seqs) >= -(-total // window)
    for s in seqs:
        assert len(s.tokens) == window and 1 <= s.length <= window
        assert (s.tokens[s.length :] == 0).all()
        bounds = list(s.starts) + [s.length]
        assert bounds[0] == 0 and all(a < b for a, b in zip(bounds, bounds[1:]))
        for a, b in zip(bounds, bounds[1:]):
            piece = s.tokens[a:b]
            # each segment is a contiguous run of one document
            assert np.array_equal(piece, np.arange(piece[0], piece[0] + len(piece)))
    # Documents that fit are never split.
    for d in docs:
        if 0 < len(d) <= window:
            holders = [s for s in seqs if d[0] in s.tokens[: s.length]]
            assert len(holders) == 1 and set(d.tolist()) <= set(holders[0].tokens.tolist())


def test_greedy_splits_long_documents_into_full_windows():
    docs = unique_documents([25, 3])
    seqs = take(GreedyPacker(ArrayDocuments(docs), seq_len=9, lookahead=2), None)
    assert [s.length for s in seqs] == [10, 10, 8]
    assert seqs[2].starts == [0, 5]


def test_greedy_efficiency_improves_with_lookahead():
    rng = np.random.default_rng(0)
    docs = unique_documents(rng.integers(1, 300, size=400))
    eff = []
    for k in (1, 8):
        seqs = take(GreedyPacker(ArrayDocuments(docs), 255, lookahead=k), None)
        eff.append(sum(s.length for s in seqs) / (len(seqs) * 256))
    assert eff[1] > eff[0] > 0.5


@pytest.mark.parametrize("stride", [None, 16, 5])
def test_concat_save_restore(stride):
    rng = np.random.default_rng(1)
    docs = unique_documents(rng.integers(0, 30, size=120))
    check_save_restore(lambda: ConcatPacker(ArrayDocuments(docs), 16, stride))


@pytest.mark.parametrize("lookahead", [1, 3])
def test_greedy_save_restore(lookahead):
    rng = np.random.default_rng(2)
    docs = unique_documents(rng.integers(0, 45, size=150))
    check_save_restore(
        lambda: GreedyPacker(ArrayDocuments(docs), 16, lookahead=lookahead, pad_id=7),
        midpoints=(0, 1, 2, 5, 17, 40, 61, -3, -2, -1),
    )


def test_batcher_save_restore_and_exact_count():
    from shardtok.stream.nodes.batcher import Batcher

    rng = np.random.default_rng(3)
    docs = unique_documents(rng.integers(1, 50, size=200))
    batches = check_save_restore(
        lambda: Batcher(ConcatPacker(ArrayDocuments(docs), 15), 3, num_batches=20),
        midpoints=(0, 1, 6, 19, 20),
    )
    assert len(batches) == 20 and batches[0]["input_ids"].shape == (3, 15)


def test_build_batch_worked_example():
    from shardtok.stream.batch import build_batch
    from shardtok.stream.sequence import PackedSequence

    # Row 0: documents [10 11 12] [13 14] [15 16] (concat, all 7 slots real).
    # Row 1: documents [20 21] [22 23 24], then 2 padding slots (greedy, pad 0).
    rows = [
        PackedSequence(np.array([10, 11, 12, 13, 14, 15, 16], np.uint16), [0, 3, 5], 7),
        PackedSequence(np.array([20, 21, 22, 23, 24, 0, 0], np.uint16), [0, 2], 5),
    ]
    batch = build_batch(rows)
    assert batch["input_ids"].tolist() == [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 0]]
    assert batch["labels"].tolist() == [[11, 12, 13, 14, 15, 16], [21, 22, 23, 24, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 0]]
    assert batch["document_ids"].tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 1, 2]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 6, 8, 11, 12]
    assert batch["max_seqlen"] == 3
    assert batch["input_ids"].dtype == np.int64 and batch["cu_seqlens"].dtype == np.int32
    masked = build_batch(rows, mask_boundary_labels=True)
    # the label whose target is a document's first token is ignored
    assert masked["labels"].tolist() == [
        [11, 12, -100, 14, -100, 16],
        [21, -100, 23, 24, -100, -100],
    ]


@pytest.mark.parametrize("kind", ["concat", "concat-stride", "greedy"])
def test_next_into_writes_the_sequences_iteration_yields(kind):
    rng = np.random.default_rng(4)
    docs = unique_documents(rng.integers(0, 60, size=300))

    def make():
        if kind == "greedy":
            return GreedyPacker(ArrayDocuments(docs), 20, lookahead=3, pad_id=9)
        return ConcatPacker(ArrayDocuments(docs), 20, 7 if kind == "concat-stride" else None)

    expected = take(make(), None)
    packer = make()
    row = np.empty(21, dtype=np.int64)
    for seq in expected:
        starts, length = packer.next_into(row)
        assert (starts, length) == (seq.starts, seq.length)
        assert np.array_equal(row, seq.tokens)
    with pytest.raises(StopIteration):
        packer.next_into(row)


class _RowByRow(ConcatPacker):
    """The same packer with its whole-batch path turned off: the reference for that path."""

    contiguous = False


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=0, max_size=60),
    seq_len=st.integers(1, 12),
    batch_size=st.integers(1, 5),
    mask=st.booleans(),
    cut=st.integers(0, 6),
)
def test_whole_batch_concat_path_equals_the_row_path(lengths, seq_len, batch_size, mask, cut):
    docs = unique_documents(lengths)

    def batcher(cls, **kw):
        return Batcher(cls(ArrayDocuments(docs), seq_len), batch_size, mask_boundary_labels=mask)

    fast, slow = batcher(ConcatPacker), batcher(_RowByRow)
    assert fast.upstream.contiguous and not slow.upstream.contiguous
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key], b[key]), (i, key)
        if i == cut:  # the state after a batch is the same, and resumes the same way
            assert fast.state_dict() == slow.state_dict()
            resumed = batcher(ConcatPacker)
            resumed.reset(fast.state_dict())
            rest_fast, rest_slow = take(resumed, None), take(batcher(_RowByRow), None)[i + 1 :]
            assert len(rest_fast) == len(rest_slow)
            for a2, b2 in zip(rest_fast, rest_slow):
                assert all(np.array_equal(a2[k], b2[k]) for k in a2)
    assert fast.stats() == slow.stats()
