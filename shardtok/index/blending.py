"""Blending indices: which source serves each sample of a weighted mix.

Megatron-core (``helpers.cpp::build_blending_indices``) and Nanotron (``build_nanoset_index_helper``)
share one greedy rule: at step ``s`` (``t = max(s, 1)``) pick the source with the largest error
``weight * t - count`` (count = samples it has served so far), ties to the lowest index.

Both compute the errors in float64, so when weights are "nice" decimals an exact tie comes out
as rounding noise: with weights ``[0.1, 0.5, 0.3, 0.1]`` every error is exactly 0 at step 10,
yet ``0.3 * 10`` is ``3.0000000000000004`` in floating point. shardtok does the arithmetic
exactly instead: each weight is read as the decimal number it prints as (``repr``; ints,
``Fraction`` and ``Decimal`` as they are), the weights are normalised as fractions, scaled to
integers ``a_i`` with sum ``S``, and the errors ``a_i * t - S * count_i`` are compared as
integers. Exact ties therefore go to the lowest index, and wherever float64 has no near-tie the
result equals Megatron's.

The loop runs once per sample (the rule is sequential), but with rational weights the error
state at multiples of ``S`` repeats, so the order is periodic; once a repeat is seen the rest is
filled by tiling. Decimal weights such as ``[0.7, 0.2, 0.1]`` therefore cost almost nothing,
and weights with a huge ``S`` cost roughly half a microsecond per sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from numbers import Integral, Real

import numpy as np

# Megatron stores the source of each sample as int16 (BlendedDataset asserts < 32767 sources).
MAX_SOURCES = np.iinfo(np.int16).max


def exact_weights(weights: Sequence[float | int | Fraction | Decimal]) -> tuple[list[int], int]:
    """Normalised weights as integers ``a_i`` over a common total ``S = sum(a_i)`` (gcd-reduced).

    A float counts as the decimal it prints as (``0.1`` is one tenth, not the nearest binary
    fraction), so the weights a user writes in a config blend exactly as written.
    """
    if len(weights) == 0:
        raise ValueError("at least one weight is needed")
    if len(weights) > MAX_SOURCES:
        raise ValueError(f"at most {MAX_SOURCES} sources can be blended, got {len(weights)}")
    fractions = [_as_fraction(w) for w in weights]
    for position, value in enumerate(fractions):
        if value <= 0:
            raise ValueError(f"weight {position} is {weights[position]!r}: weights must be > 0")
    common = math.lcm(*(f.denominator for f in fractions))
    scaled = [f.numerator * (common // f.denominator) for f in fractions]
    divisor = math.gcd(*scaled)
    scaled = [value // divisor for value in scaled]
    return scaled, sum(scaled)


def _as_fraction(weight: float | int | Fraction | Decimal) -> Fraction:
    if isinstance(weight, (Fraction, Decimal)):
        value = Fraction(weight)
    elif isinstance(weight, (bool, np.bool_)):
        raise ValueError(f"weight {weight!r} is a bool, not a number")
    elif isinstance(weight, Integral):
        value = Fraction(int(weight))
    elif isinstance(weight, Real):
        if not math.isfinite(float(weight)):
            raise ValueError(f"weight {weight!r} is not finite")
        # str() is the shortest decimal that reads back as the same float, for Python and numpy
        # floats of any width alike: np.float32(0.1) counts as one tenth, as printed.
        value = Fraction(str(weight))
    else:
        raise ValueError(f"weight {weight!r} is not a number")
    return value


def _greedy_order(scaled: list[int], total: int, num_samples: int) -> np.ndarray:
    """The source chosen at every step (int16), by the exact greedy rule.

    ``debt[i] = total * count_i``, so the error of source i at step s is
    ``scaled[i] * max(s, 1) - debt[i]``. At every multiple of ``total`` (from ``total`` on) the
    future depends only on ``count_i - scaled_i * s / total``; the first repeat of that state
    proves the order periodic from the earlier occurrence, and the remainder is tiled from it.
    """
    order = np.zeros(num_samples, dtype=np.int16)
    debt = [0] * len(scaled)
    seen_states: dict[tuple[int, ...], int] = {}
    step = 0
    while step < num_samples:
        chunk_end = min(num_samples, (step // total + 1) * total)
        order[step:chunk_end] = greedy_picks(scaled, total, debt, step, chunk_end)
        step = chunk_end
        if step < num_samples:
            cycle = step // total
            state = tuple(d // total - a * cycle for d, a in zip(debt, scaled, strict=True))
            if state in seen_states:
                period_start = seen_states[state]
                _tile(order, period_start, step)
                return order
            seen_states[state] = step
    return order


def greedy_picks(scaled: list[int], total: int, debt: list[int], start: int, end: int) -> list[int]:
    """The sources chosen at steps [start, end) by the greedy rule, given ``debt[i] = total *
    count_i`` before `start` (updated in place): the one loop both the Megatron-style index and
    the stream's mix schedule run."""
    others = list(enumerate(scaled))[1:]
    first_weight = scaled[0]
    picks: list[int] = []
    append = picks.append
    for s in range(start, end):
        t = s or 1
        best = 0
        best_error = first_weight * t - debt[0]
        for source, weight in others:
            error = weight * t - debt[source]
            if error > best_error:
                best_error = error
                best = source
        append(best)
        debt[best] += total
    return picks


def _tile(order: np.ndarray, period_start: int, period_end: int) -> None:
    """Fill ``order[period_end:]`` by repeating ``order[period_start:period_end]``."""
    period = order[period_start:period_end]
    remaining = order.shape[0] - period_end
    repeats = -(-remaining // period.shape[0])
    order[period_end:] = np.tile(period, repeats)[:remaining]


def per_source_counters(dataset_index: np.ndarray, num_sources: int) -> np.ndarray:
    """For each sample, how many earlier samples came from the same source (int64)."""
    counters = np.empty(dataset_index.shape[0], dtype=np.int64)
    for source in range(num_sources):
        positions = np.flatnonzero(dataset_index == source)
        counters[positions] = np.arange(positions.shape[0], dtype=np.int64)
    return counters


def build_blending_indices(
    weights: Sequence[float | int | Fraction | Decimal],
    dataset_lengths: Sequence[int] | None,
    num_samples: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index, dataset_sample_index)`` for ``num_samples`` samples of a weighted blend.

    ``dataset_index[k]`` (int16) is the source of sample ``k`` by the exact greedy rule (module
    docstring). ``dataset_sample_index[k]`` (int64) is the sample to read from that source: its
    per-source counter, wrapped modulo ``dataset_lengths[source]`` as Nanotron's Nanosets do, so
    it is always a valid index and a small source repeats. With ``dataset_lengths=None`` the
    counter is returned unwrapped, as Megatron's BlendedDataset uses it (Megatron then refuses a
    blend that asks a source for more samples than it has).

    >>> index, sample = build_blending_indices([0.1, 0.5, 0.3, 0.1], [8, 2, 5, 5], 20)
    >>> index.tolist()
    [1, 2, 0, 1, 3, 1, 2, 1, 2, 1, 0, 1, 2, 1, 3, 1, 2, 1, 2, 1]
    >>> sample.tolist()
    [0, 0, 0, 1, 0, 0, 1, 1, 2, 0, 1, 1, 3, 0, 1, 1, 4, 0, 0, 1]
    """
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    scaled, total = exact_weights(weights)
    dataset_index = _greedy_order(scaled, total, num_samples)
    counters = per_source_counters(dataset_index, len(scaled))
    if dataset_lengths is None:
        return dataset_index, counters
    lengths = np.asarray(dataset_lengths, dtype=np.int64)
    if lengths.shape != (len(scaled),):
        raise ValueError(
            f"{len(scaled)} weights but {lengths.size} dataset lengths: give one length per source"
        )
    if (lengths <= 0).any():
        raise ValueError(f"dataset lengths must be > 0, got {lengths.tolist()}")
    return dataset_index, counters % lengths[dataset_index]


def nanoset_blended_order(
    weights: Sequence[float | int | Fraction | Decimal],
    dataset_lengths: Sequence[int],
    num_samples: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Nanotron's Nanoset order: one blended epoch, shuffled, repeated, cut to ``num_samples``.

    One epoch is ``sum(dataset_lengths)`` samples blended by :func:`build_blending_indices`
    (wrapped per source). Both arrays are shuffled with the same permutation, drawn as Nanotron
    does (``numpy.random.RandomState(seed).shuffle``, once per array from a fresh state with the
    same seed), then the epoch is repeated ``num_samples // samples_per_epoch + 1`` times and cut
    to ``num_samples``.
    """
    samples_per_epoch = int(np.sum(np.asarray(dataset_lengths, dtype=np.int64)))
    if samples_per_epoch <= 0:
        raise ValueError(f"dataset lengths must be > 0, got {list(dataset_lengths)}")
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    dataset_index, dataset_sample_index = build_blending_indices(
        weights, dataset_lengths, samples_per_epoch
    )
    permutation = np.arange(samples_per_epoch)
    np.random.RandomState(seed).shuffle(permutation)
    dataset_index = dataset_index[permutation]
    dataset_sample_index = dataset_sample_index[permutation]
    repeats = num_samples // samples_per_epoch + 1
    return (
        np.tile(dataset_index, repeats)[:num_samples],
        np.tile(dataset_sample_index, repeats)[:num_samples],
    )
