"""Loss masks through the packers and into the labels: nothing lost, nothing across documents.

Token ids say where they come from and their mask bit is a function of the id
(tests/helpers/masked.py), so every property is checked exactly from the output alone.
"""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream.batch import IGNORE_INDEX, to_hf_labels
from shardtok.stream.masked import flag_untrained
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.bfd import BFDPacker
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.shuffle import ShuffleBuffer
from shardtok.stream.options import OVERLONG
from shardtok.testing.save_restore import check_save_restore
from tests.helpers.masked import Known, expected_shifted_labels

KINDS = ("greedy", "bfd", "concat")


def make_packer(kind, docs, seq_len, size=4, overlong="split", masked=True):
    upstream = ArrayDocuments(docs)
    if kind == "concat":
        return ConcatPacker(upstream, seq_len, masked=masked)
    if kind == "bfd":
        return BFDPacker(upstream, seq_len, bfd_window=size, overlong=overlong, masked=masked)
    return GreedyPacker(upstream, seq_len, lookahead=size, overlong=overlong, masked=masked)


def kept(lengths, window, overlong):
    """Tokens of each document a padding packer keeps."""
    if overlong == "split":
        return list(lengths)
    return [n if n <= window else (window if overlong == "truncate" else 0) for n in lengths]


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), max_size=40),
    seq_len=st.integers(1, 20),
    size=st.integers(1, 9),
    kind=st.sampled_from(KINDS),
    overlong=st.sampled_from(OVERLONG),
    seed=st.integers(0, 50),
)
def test_packing_loses_and_duplicates_no_token_or_mask_bit(
    lengths, seq_len, size, kind, overlong, seed
):
    known = Known(lengths, seed=seed)
    packer = make_packer(kind, known.masked_documents(), seq_len, size, overlong)
    seqs = take(packer, None)
    window = seq_len + 1
    got = np.concatenate([s.tokens[: s.length] for s in seqs] or [np.empty(0, np.int64)])
    bits = np.concatenate([s.mask[: s.length] for s in seqs] or [np.empty(0, np.uint8)])
    assert np.array_equal(bits, known.mask[got]), "a mask bit left its token"
    for s in seqs:
        assert s.tokens.shape == s.mask.shape == (window,)
        assert (s.tokens[s.length :] == 0).all() and (s.mask[s.length :] == 0).all()
    if kind == "concat":  # the stream in order, cut into windows; only the tail is unread
        assert np.array_equal(got, np.arange(known.first, known.first + len(got)))
        assert known.end - known.first - len(got) < window
        return
    # Each kept (document, offset) exactly once: the first `kept` tokens of every document.
    want = [d[:n] for d, n in zip(known.documents(), kept(lengths, window, overlong))]
    want = np.concatenate(want or [np.empty(0, np.int32)])
    assert np.array_equal(np.sort(got), want)
    long = [n for n in lengths if n > window]
    assert packer.overlong.documents == len(long)
    assert packer.overlong.dropped == sum(lengths) - len(want)


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=40),
    seq_len=st.integers(1, 16),
    batch_size=st.integers(1, 3),
    kind=st.sampled_from(KINDS),
    boundary=st.booleans(),
    seed=st.integers(0, 50),
)
def test_masked_labels_follow_the_masks_and_never_cross_a_document(
    lengths, seq_len, batch_size, kind, boundary, seed
):
    known = Known(lengths, seed=seed)

    def batches(labels_format):
        packer = make_packer(kind, known.masked_documents(), seq_len)
        return take(Batcher(packer, batch_size, mask_boundary_labels=boundary,
                            labels_format=labels_format), None)  # fmt: skip

    shifted, hf = batches("shifted"), batches("hf")
    rows = take(make_packer(kind, known.masked_documents(), seq_len), None)
    for b, (s, h) in enumerate(zip(shifted, hf, strict=True)):
        window = np.stack([r.tokens for r in rows[b * batch_size : (b + 1) * batch_size]])
        assert np.array_equal(s["input_ids"], window[:, :-1])
        # Whatever mask_boundary_labels says: masked data never learns its neighbour.
        want = expected_shifted_labels([known], [True], window, boundary=True)
        assert np.array_equal(s["labels"], want)
        assert np.array_equal(h["labels"], to_hf_labels(want.copy()))
        assert s["num_trained_tokens"] == int((want != IGNORE_INDEX).sum())
        assert h["num_trained_tokens"] == int((h["labels"] != IGNORE_INDEX).sum())
        assert np.array_equal(s["position_ids"], h["position_ids"])


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    seq_len=st.integers(2, 16),
    kind=st.sampled_from(KINDS),
    boundary=st.booleans(),
    labels_format=st.sampled_from(["shifted", "hf"]),
)
def test_unmasked_batches_count_their_trained_labels(
    lengths, seq_len, kind, boundary, labels_format
):
    # Without masks the count is arithmetic (no pass over the labels): it must still be exact.
    known = Known(lengths)
    packer = make_packer(kind, known.documents(), seq_len, masked=False)
    for batch in Batcher(packer, 2, mask_boundary_labels=boundary, labels_format=labels_format):
        assert batch["num_trained_tokens"] == int((batch["labels"] != IGNORE_INDEX).sum())
        if labels_format == "shifted":
            window = np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)
            if kind == "concat" or boundary:
                want = expected_shifted_labels([known], [False], window, boundary)
                trained = batch["labels"] != IGNORE_INDEX
                assert np.array_equal(batch["labels"][trained], want[trained])


def test_a_worked_example():
    # Two conversations, prompt untrained; greedy packs both into one window of 12 slots.
    docs = [
        flag_untrained(np.array([11, 12, 13, 14, 15]), np.array([0, 0, 1, 1, 1], np.uint8)),
        flag_untrained(np.array([21, 22, 23, 24]), np.array([0, 1, 1, 1], np.uint8)),
    ]
    batch = next(Batcher(GreedyPacker(ArrayDocuments(docs), 11, masked=True), 1))
    assert batch["input_ids"].tolist() == [[11, 12, 13, 14, 15, 21, 22, 23, 24, 0, 0]]
    # Target of 12 is 13 (trained); 15 -> 21 crosses into the next conversation: never.
    assert batch["labels"].tolist() == [[-100, 13, 14, 15, -100, 22, 23, 24, -100, -100, -100]]
    assert batch["num_trained_tokens"] == 6
    hf = next(Batcher(GreedyPacker(ArrayDocuments(docs), 11, masked=True), 1, labels_format="hf"))
    assert hf["labels"].tolist() == [[-100, -100, 13, 14, 15, -100, 22, 23, 24, -100, -100]]
    assert hf["num_trained_tokens"] == 6


def test_truncate_and_drop_keep_the_start_or_nothing():
    doc = flag_untrained(np.arange(1, 11), np.ones(10, np.uint8))
    short = flag_untrained(np.array([50, 51]), np.array([0, 1], np.uint8))
    for overlong, first in (("truncate", list(range(1, 6))), ("drop", [50, 51, 0, 0, 0])):
        for kind in ("greedy", "bfd"):
            seqs = take(make_packer(kind, [doc, short], 4, overlong=overlong), None)
            assert seqs[0].tokens.tolist() == first, (overlong, kind)
            assert sum(s.length for s in seqs) == (7 if overlong == "truncate" else 2)


def test_masked_packers_save_and_restore():
    known = Known([int(n) for n in np.random.default_rng(3).integers(1, 60, size=150)])
    for kind in KINDS:
        for overlong in ("split", "truncate"):
            check_save_restore(
                lambda k=kind, o=overlong: make_packer(k, known.masked_documents(), 23, 7, o),
                midpoints=(0, 1, 5, 17, -1),
            )


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=60),
    seq_len=st.integers(1, 24),
    window=st.integers(1, 12),
    shuffle=st.integers(1, 16),
    overlong=st.sampled_from(OVERLONG),
    midpoints=st.lists(st.integers(0, 40), min_size=1, max_size=4),
)
def test_bfd_with_masks_resumes_exactly_anywhere(
    lengths, seq_len, window, shuffle, overlong, midpoints
):
    # Behind a shuffle buffer, as in a stream: the state holds positions only, and the window
    # re-read on restore brings its masks back with its tokens.
    known = Known(lengths, seed=len(lengths))

    def make():
        documents = ShuffleBuffer(ArrayDocuments(known.masked_documents()), shuffle, (3, 1))
        packer = BFDPacker(documents, seq_len, bfd_window=window, overlong=overlong, masked=True)
        return Batcher(packer, 2, labels_format="hf")

    batches = check_save_restore(make, midpoints=midpoints)
    state = make()
    take(state, len(batches) // 2)
    assert "mask" not in json.dumps(state.state_dict())  # positions, never tokens or masks
