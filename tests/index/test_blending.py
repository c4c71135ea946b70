"""shardtok.index.blending: the Nanosets worked example, exact ties, Megatron's C++, properties."""

from __future__ import annotations

import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardtok.index import build_blending_indices, exact_weights, nanoset_blended_order

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets import helpers_cpp
    from megatron.core.datasets.utils import normalize

NOTE_WEIGHTS = [0.1, 0.5, 0.3, 0.1]
NOTE_LENGTHS = [8, 2, 5, 5]
NOTE_INDEX = [1, 2, 0, 1, 3, 1, 2, 1, 2, 1, 0, 1, 2, 1, 3, 1, 2, 1, 2, 1]
NOTE_SAMPLE_INDEX = [0, 0, 0, 1, 0, 0, 1, 1, 2, 0, 1, 1, 3, 0, 1, 1, 4, 0, 0, 1]


def reference_greedy(weights: list[Fraction], num_samples: int) -> list[int]:
    """The rule as written, in exact arithmetic, one step at a time, no shortcuts."""
    total = sum(weights)
    normalised = [w / total for w in weights]
    counts = [0] * len(weights)
    order = []
    for step in range(num_samples):
        errors = [w * max(step, 1) - c for w, c in zip(normalised, counts, strict=True)]
        chosen = errors.index(max(errors))  # first maximum: ties go to the lowest index
        order.append(chosen)
        counts[chosen] += 1
    return order


def megatron_blend(weights: np.ndarray, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    dataset_index = np.zeros(num_samples, dtype=np.int16)
    dataset_sample_index = np.zeros(num_samples, dtype=np.int64)
    helpers_cpp.build_blending_indices(
        dataset_index, dataset_sample_index, weights, len(weights), num_samples, False
    )
    return dataset_index, dataset_sample_index


def test_nanosets_note_example():
    dataset_index, dataset_sample_index = build_blending_indices(NOTE_WEIGHTS, NOTE_LENGTHS, 20)
    assert dataset_index.dtype == np.int16 and dataset_sample_index.dtype == np.int64
    assert dataset_index.tolist() == NOTE_INDEX
    assert dataset_sample_index.tolist() == NOTE_SAMPLE_INDEX


@pytest.mark.parametrize(
    "weights",
    [
        [1, 5, 3, 1],
        [10, 50, 30, 10],
        [0.2, 1.0, 0.6, 0.2],
        [Fraction(1, 10), Fraction(1, 2), Fraction(3, 10), Fraction(1, 10)],
        [Decimal("0.1"), Decimal("0.5"), Decimal("0.3"), Decimal("0.1")],
        list(np.array(NOTE_WEIGHTS, dtype=np.float32)),
    ],
)
def test_exact_tie_at_step_10_goes_to_the_lowest_index_for_any_spelling(weights):
    dataset_index, _ = build_blending_indices(weights, NOTE_LENGTHS, 20)
    assert dataset_index.tolist() == NOTE_INDEX


def test_megatron_float_arithmetic_breaks_the_tie_by_rounding():
    # Why shardtok computes exactly: Megatron's BlendedDataset normalises the same weights in
    # float64 and then picks source 1 at step 10, where every exact error is 0.
    megatron_index, _ = megatron_blend(np.array(normalize(NOTE_WEIGHTS)), 20)
    assert megatron_index[10] != 0
    ours, _ = build_blending_indices(NOTE_WEIGHTS, None, 20)
    assert ours[10] == 0


def test_exact_weights_reads_floats_as_printed():
    assert exact_weights([0.1, 0.5, 0.3, 0.1]) == ([1, 5, 3, 1], 10)
    assert exact_weights([np.float32(0.1), 0.5, 3, np.float64(0.25)]) == ([2, 10, 60, 5], 77)
    assert exact_weights([7]) == ([1], 1)


@pytest.mark.parametrize("bad", [[0.5, 0.0], [1, -1], [float("nan"), 1.0], [float("inf")], []])
def test_weights_must_be_positive_finite_numbers(bad):
    with pytest.raises(ValueError):
        build_blending_indices(bad, None, 5)


def test_lengths_must_match_and_be_positive():
    with pytest.raises(ValueError, match="one length per source"):
        build_blending_indices([1, 1], [3], 5)
    with pytest.raises(ValueError, match="> 0"):
        build_blending_indices([1, 1], [3, 0], 5)


@settings(max_examples=120, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=8),
    num_samples=st.integers(0, 1500),
)
def test_equals_megatron_cpp_where_float64_has_no_near_tie(weights, num_samples):
    normalised = np.array(weights) / np.sum(weights)
    reference_index, reference_counter = megatron_blend(normalised, num_samples)
    # Skip inputs where float64 errors come within 1e-9 of a tie: there Megatron's pick is
    # rounding noise and the exact rule may rightly differ.
    counts = np.zeros((num_samples + 1, len(weights)))
    counts[np.arange(1, num_samples + 1), reference_index] = 1
    counts = np.cumsum(counts, axis=0)[:-1]
    steps = np.maximum(np.arange(num_samples), 1)[:, None]
    errors = np.sort(normalised * steps - counts, axis=1)
    if len(weights) > 1 and num_samples:
        assume(np.min(errors[:, -1] - errors[:, -2]) > 1e-9)
    ours_index, ours_counter = build_blending_indices(weights, None, num_samples)
    np.testing.assert_array_equal(ours_index, reference_index)
    np.testing.assert_array_equal(ours_counter, reference_counter)


@settings(max_examples=150, deadline=None)
@given(weights=st.lists(st.integers(1, 12), min_size=1, max_size=6), periods=st.integers(0, 6))
def test_periodic_shortcut_equals_the_plain_rule(weights, periods):
    # Small integer weights make the order periodic early, so most of it comes from tiling.
    num_samples = periods * sum(weights) + 7
    dataset_index, _ = build_blending_indices(weights, None, num_samples)
    expected = reference_greedy([Fraction(w) for w in weights], num_samples)
    assert dataset_index.tolist() == expected


def _prefix_errors(weights: list[int], num_samples: int) -> tuple[np.ndarray, int]:
    """Exact ``(w_i * N - count_i(N)) * S`` for every prefix length N = 1..num_samples."""
    scaled, total = exact_weights(weights)
    dataset_index, _ = build_blending_indices(weights, None, num_samples)
    one_hot = np.zeros((num_samples, len(weights)), dtype=np.int64)
    one_hot[np.arange(num_samples), dataset_index] = 1
    counts = np.cumsum(one_hot, axis=0)
    prefix = np.arange(1, num_samples + 1, dtype=np.int64)[:, None]
    return np.array(scaled, dtype=np.int64) * prefix - total * counts, total


@settings(max_examples=80, deadline=None)
@given(weights=st.lists(st.integers(1, 1000), min_size=2, max_size=6))
def test_counts_track_their_weights(weights):
    # After any N samples no source is a whole sample ahead of weight * N (it is only picked
    # while it lags), and hence, errors summing to zero, none lags by n - 1 or more. With two
    # sources that is "within 1" both ways.
    errors, total = _prefix_errors(weights, 600)
    assert (errors > -total).all()
    assert (errors < (len(weights) - 1) * total).all()
    assert (errors.sum(axis=1) == 0).all()


def test_with_three_sources_a_count_can_lag_by_more_than_one():
    # Weights 1:1:7, after 4 samples [2, 0, 2, 1]: source 2 has 2 samples, 7/9 * 4 = 3.11 due.
    dataset_index, _ = build_blending_indices([1, 1, 7], None, 4)
    assert dataset_index.tolist() == [2, 0, 2, 1]
    errors, total = _prefix_errors([1, 1, 7], 4)
    assert Fraction(int(errors[-1, 2]), total) == Fraction(10, 9)


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    data=st.data(),
    num_samples=st.integers(0, 400),
)
def test_sample_index_wraps_each_source_counter(weights, data, num_samples):
    lengths = data.draw(st.lists(st.integers(1, 9), min_size=len(weights), max_size=len(weights)))
    dataset_index, wrapped = build_blending_indices(weights, lengths, num_samples)
    same_index, counters = build_blending_indices(weights, None, num_samples)
    np.testing.assert_array_equal(dataset_index, same_index)
    for source in range(len(weights)):
        mine = dataset_index == source
        assert counters[mine].tolist() == list(range(int(mine.sum())))
        assert wrapped[mine].tolist() == [c % lengths[source] for c in counters[mine]]


def test_single_source_and_zero_samples():
    dataset_index, sample_index = build_blending_indices([3.0], [4], 6)
    assert dataset_index.tolist() == [0] * 6 and sample_index.tolist() == [0, 1, 2, 3, 0, 1]
    empty_index, empty_samples = build_blending_indices([1, 2], [3, 3], 0)
    assert empty_index.shape == empty_samples.shape == (0,)


def nanotron_reference(weights, lengths, num_samples, seed):
    """Nanotron's build_nanoset_index, step by step (each array shuffled by a fresh state)."""
    samples_per_epoch = sum(lengths)
    epoch_index, epoch_samples = build_blending_indices(weights, lengths, samples_per_epoch)
    np.random.RandomState(seed).shuffle(epoch_index)
    np.random.RandomState(seed).shuffle(epoch_samples)
    repeats = int(num_samples / samples_per_epoch) + 1
    return (
        np.concatenate([epoch_index] * repeats)[:num_samples],
        np.concatenate([epoch_samples] * repeats)[:num_samples],
    )


@pytest.mark.parametrize(("num_samples", "seed"), [(70, 1234), (20, 0), (7, 5), (0, 1)])
def test_nanoset_order_structure(num_samples, seed):
    dataset_index, sample_index = nanoset_blended_order(
        NOTE_WEIGHTS, NOTE_LENGTHS, num_samples, seed
    )
    assert dataset_index.shape == sample_index.shape == (num_samples,)
    epoch_pairs = sorted(zip(NOTE_INDEX, NOTE_SAMPLE_INDEX, strict=True))
    pairs = list(zip(dataset_index.tolist(), sample_index.tolist(), strict=True))
    # Each full epoch is the note's epoch with both arrays moved by one permutation ...
    if num_samples >= 20:
        assert sorted(pairs[:20]) == epoch_pairs
    # ... and later epochs repeat the first one, cut at num_samples.
    for k in range(20, num_samples):
        assert pairs[k] == pairs[k % 20]
    for got, expected in zip(
        (dataset_index, sample_index),
        nanotron_reference(NOTE_WEIGHTS, NOTE_LENGTHS, num_samples, seed),
        strict=True,
    ):
        np.testing.assert_array_equal(got, expected)


def test_nanoset_order_depends_on_the_seed():
    first, _ = nanoset_blended_order(NOTE_WEIGHTS, NOTE_LENGTHS, 20, 1)
    second, _ = nanoset_blended_order(NOTE_WEIGHTS, NOTE_LENGTHS, 20, 2)
    assert sorted(first.tolist()) == sorted(second.tolist()) == sorted(NOTE_INDEX)
    assert first.tolist() != second.tolist()
