"""The jittered-sort shuffle buffer: a bounded permutation with exact save/restore."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.errors import ResumeStateError
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.shuffle import TOKEN_RUN, ShuffleBuffer
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


# -- the token bound --------------------------------------------------------------------------


def sized(sizes) -> list[np.ndarray]:
    """Document i: `sizes[i]` tokens, all equal to i (so the order can be read back)."""
    return [np.full(int(n), i, dtype=np.int32) for i, n in enumerate(sizes)]


def skewed_sizes(n: int, seed: int = 0) -> np.ndarray:
    """Short documents with long ones among them, the long ones in a run as in a corpus of
    docstrings followed by files."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 30, size=n)
    sizes[n // 2 :] = rng.integers(200, 3000, size=n - n // 2)
    return sizes


def keys_by_the_rule(sizes, window: int, token_window: int, seed) -> list[int]:
    """The emission order from the module docstring's rule, computed independently."""
    n = len(sizes)
    before = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.float64)
    places = np.arange(n, dtype=np.float64)
    if token_window:
        places = places + before * (window / token_window)
    jitter = np.concatenate(
        [np.random.default_rng((*seed, b)).random(4096) * window for b in range(n // 4096 + 1)]
    )[:n]
    return np.lexsort((np.arange(n), places + jitter)).tolist()


@pytest.mark.parametrize("token_window", [0, 500, 20_000])
def test_the_order_is_the_documented_key_sort(token_window):
    sizes = skewed_sizes(5000)
    node = ShuffleBuffer(ArrayDocuments(sized(sizes)), 300, (4, 1), token_window)
    assert order(node) == keys_by_the_rule(sizes, 300, token_window, (4, 1))


def test_without_a_token_bound_the_order_is_the_one_before_it():
    # The keys of the count-only buffer are the ordinals' (p_i = i): states and streams saved
    # before the token bound existed are reproduced with token_window=0.
    sizes = skewed_sizes(3000)
    plain = order(ShuffleBuffer(ArrayDocuments(sized(sizes)), 200, (9,)))
    assert plain == keys_by_the_rule(np.ones(3000), 200, 0, (9,))


@pytest.mark.parametrize("token_window", [20_000, 200_000])
def test_a_token_bound_holds_fewer_than_about_that_many_tokens(token_window):
    sizes = skewed_sizes(6000)
    node = ShuffleBuffer(ArrayDocuments(sized(sizes)), 4096, (3,), token_window)
    count_only = ShuffleBuffer(ArrayDocuments(sized(sizes)), 4096, (3,))
    peak = peak_count_only = 0
    for _ in node:
        peak = max(peak, node.held_tokens)
    for _ in count_only:
        peak_count_only = max(peak_count_only, count_only.held_tokens)
    # Held: under the window, plus one read round (a sixteenth of it, overshot by at most
    # TOKEN_RUN documents where long ones follow short ones).
    assert peak <= token_window * (1 + 1 / 16) + TOKEN_RUN * sizes.max()
    assert peak_count_only > 10 * token_window  # what the bound is for


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 400), max_size=400),
    window=st.integers(1, 64),
    token_window=st.integers(1, 3000),
    seed=st.integers(0, 2**31),
)
def test_a_token_bounded_shuffle_is_a_permutation_moving_at_most_the_window(
    sizes, window, token_window, seed
):
    out = order(ShuffleBuffer(ArrayDocuments(sized(sizes)), window, (seed,), token_window))
    assert sorted(out) == list(range(len(sizes)))
    for emitted_at, ordinal in enumerate(out):
        assert abs(emitted_at - ordinal) <= window


@pytest.mark.parametrize("window, token_window", [(1, 10), (7, 300), (300, 5_000)])
def test_token_bounded_save_restore(window, token_window):
    docs = sized(skewed_sizes(3000, seed=2))
    check_save_restore(
        lambda: ShuffleBuffer(ArrayDocuments(docs), window, (11, 2), token_window),
        midpoints=(0, 1, 7, 299, 300, 1024, 1500, 2999, 3000, -1),
    )


def test_token_bounded_round_size_changes_buffering_not_the_order():
    docs = sized(skewed_sizes(6000, seed=1))
    reference = order(ShuffleBuffer(ArrayDocuments(docs), 1000, (5, 0), 20_000))
    for round_size in (1, 7, 64, 5000):
        node = ShuffleBuffer(ArrayDocuments(docs), 1000, (5, 0), 20_000)
        node.round = round_size
        assert order(node) == reference


def test_a_state_of_the_other_kind_of_buffer_is_refused():
    docs = sized(skewed_sizes(500))
    bounded = ShuffleBuffer(ArrayDocuments(docs), 50, (1,), 1_000)
    take(bounded, 100)
    with_tokens = bounded.state_dict()
    assert "read_tokens" in with_tokens
    count_only = ShuffleBuffer(ArrayDocuments(docs), 50, (1,))
    take(count_only, 100)
    without = count_only.state_dict()
    assert "read_tokens" not in without  # the fields states had before the bound
    with pytest.raises(ResumeStateError, match="saved with a token bound"):
        ShuffleBuffer(ArrayDocuments(docs), 50, (1,)).reset(with_tokens)
    with pytest.raises(ResumeStateError, match="saved without a token bound"):
        ShuffleBuffer(ArrayDocuments(docs), 50, (1,), 1_000).reset(without)
