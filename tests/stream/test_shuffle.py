"""The jittered-sort shuffle buffer: a bounded permutation with exact save/restore."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.shuffle import ShuffleBuffer
from shardtok.testing.save_restore import check_save_restore


def numbered(n: int) -> list[np.ndarray]:
    return [np.array([i], dtype=np.int32) for i in range(n)]


def order(node) -> list[int]:
    return [int(d[0]) for d in take(node, None)]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), window=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_shuffle_is_a_bounded_permutation(n, window, seed):
    out = order(ShuffleBuffer(ArrayDocuments(numbered(n)), window, (seed,)))
    assert sorted(out) == list(range(n))
    for emitted_at, ordinal in enumerate(out):
        assert abs(emitted_at - ordinal) <= window


@pytest.mark.parametrize("window", [50, 4000])
def test_shuffle_holds_at_most_about_window_documents(window):
    node = ShuffleBuffer(ArrayDocuments(numbered(20000)), window, (3,))
    peak = 0
    for _ in node:
        peak = max(peak, node.held)
    assert peak <= 1.25 * window + 64 + 1


def test_shuffle_depends_on_seed_and_actually_shuffles():
    a = order(ShuffleBuffer(ArrayDocuments(numbered(500)), 100, (1, 0)))
    b = order(ShuffleBuffer(ArrayDocuments(numbered(500)), 100, (1, 0)))
    c = order(ShuffleBuffer(ArrayDocuments(numbered(500)), 100, (1, 1)))
    assert a == b and a != c and a != list(range(500))
    # A window of 100 moves documents far: the mean displacement is tens of places.
    assert np.mean(np.abs(np.array(a) - np.arange(500))) > 15


@pytest.mark.parametrize("window", [1, 7, 300])
def test_shuffle_save_restore(window):
    docs = numbered(3000)
    check_save_restore(
        lambda: ShuffleBuffer(ArrayDocuments(docs), window, (11, 2)),
        midpoints=(0, 1, 7, 299, 300, 1024, 1500, 2999, 3000, -1),
    )


def test_packers_over_shuffle_save_restore():
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 40, size=2500)
    docs, at = [], 0
    for n in lengths:
        docs.append(np.arange(at, at + n, dtype=np.int32))
        at += n
    check_save_restore(
        lambda: ConcatPacker(ShuffleBuffer(ArrayDocuments(docs), 64, (1,)), 31),
        midpoints=(0, 3, 100, 555, 1400, -1),
    )
    check_save_restore(
        lambda: GreedyPacker(ShuffleBuffer(ArrayDocuments(docs), 700, (2,)), 63, lookahead=4),
        midpoints=(0, 3, 100, 555, 800, -2, -1),
    )


@pytest.mark.parametrize("window", [1, 100, 4096])
def test_round_size_changes_buffering_not_the_order(window):
    docs = numbered(9000)
    reference = order(ShuffleBuffer(ArrayDocuments(docs), window, (5, 0)))
    for round_size in (1, 7, 64, 5000):
        node = ShuffleBuffer(ArrayDocuments(docs), window, (5, 0))
        node.round = round_size
        assert order(node) == reference
