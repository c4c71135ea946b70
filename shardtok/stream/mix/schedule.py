"""``MixSchedule``: which source of a weighted mix serves each step (packed sequence).

Megatron's greedy error-minimising rule with shardtok's exact tie-break
(``shardtok.index.build_blending_indices``; the rule is not written twice), computed a block at a
time and kept periodic, so any step or count costs bounded memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from shardtok.index import exact_weights
from shardtok.index.blending import greedy_picks


class MixSchedule:
    """Which source serves each step: the exact greedy rule, in bounded memory at any step.

    The rule is sequential, but its state at every multiple of the weights' common total ``S``
    (``blending._greedy_order``) decides everything after it, so the order is periodic once such
    a state repeats. Picks are made a block at a time from the rule's state (the counts so far),
    and a period found no longer than ``PERIOD_LIMIT`` is kept, after which any step or count
    is arithmetic: a saved state's step costs the same memory whether it is 10 or 10**15 (a
    whole prefix up to the step took 10 bytes a step). Without such a period (a huge ``S``) a
    far step costs time in proportion, as a run that got there did, but memory stays a block.
    """

    BLOCK = 1 << 16
    PERIOD_LIMIT = 1 << 22  # int16 picks: 8 MiB at most
    MAX_STEPS = 1 << 62  # counts stay within int64 everywhere downstream

    def __init__(self, weights: Sequence[float | int | Fraction]):
        self.weights = list(weights)
        self._scaled, self._total = exact_weights(self.weights)
        self._checkpoints: dict[tuple[int, ...], tuple[int, list[int]]] = {}
        # period: (first step, picks of one period, counts before its first step, its counts)
        self._period: tuple[int, np.ndarray, list[int], list[int]] | None = None
        self._restart(0, [0] * len(self._scaled))

    def _restart(self, step: int, counts: list[int]) -> None:
        self._block = np.zeros(0, dtype=np.int16)
        self._block_start = step
        self._block_counts = list(counts)  # picks per source before `_block_start`
        self._pos, self._counts = step, list(counts)

    def _picks(self, start: int, counts: list[int], end: int) -> np.ndarray:
        """The picks of steps [start, end) after `counts` picks per source: the index's own
        rule (``blending.greedy_picks``)."""
        debt = [self._total * c for c in counts]
        return np.array(greedy_picks(self._scaled, self._total, debt, start, end), np.int16)

    def _next_block(self) -> None:
        """Picks from ``_pos`` on, up to a block or the next multiple of ``S``; at that multiple
        a state seen before makes the period."""
        start, total = self._pos, self._total
        end = min(start + self.BLOCK, (start // total + 1) * total)
        picks = self._picks(start, self._counts, end)
        self._block_counts = list(self._counts)
        for source, n in enumerate(np.bincount(picks, minlength=len(self._scaled)).tolist()):
            self._counts[source] += n
        self._block, self._block_start, self._pos = picks, start, end
        if end % total == 0:
            cycle = end // total
            key = tuple(c - a * cycle for c, a in zip(self._counts, self._scaled, strict=True))
            seen = self._checkpoints.setdefault(key, (end, list(self._counts)))[0]
            if self._period is None and seen < end <= seen + self.PERIOD_LIMIT:
                first, before = self._checkpoints[key]
                period = self._picks(first, before, end)
                after = [c - b for c, b in zip(self._counts, before, strict=True)]
                self._period = (first, period, before, after)

    def _seek(self, step: int) -> None:
        """Make the current block hold `step` (not past a known period's start)."""
        if step < self._block_start:
            # back to the latest rule state at or before `step`: 0, or a multiple of S
            begin, counts = 0, [0] * len(self._scaled)
            for first, before in self._checkpoints.values():
                if begin < first <= step:
                    begin, counts = first, before
            self._restart(begin, counts)
        while step >= self._pos and not self._in_period(step):
            self._next_block()

    def _in_period(self, step: int) -> bool:
        return self._period is not None and step >= self._period[0]

    def __getitem__(self, step: int) -> int:
        start = self._block_start
        if start <= step < self._pos:  # the stream asks step after step: mostly this block
            return int(self._block[step - start])
        self._seek(step)
        if self._in_period(step):
            assert self._period is not None
            first, period, _, _ = self._period
            return int(period[(step - first) % period.shape[0]])
        return int(self._block[step - self._block_start])

    def counts(self, steps: int) -> list[int]:
        """How many of the first `steps` picks each source got."""
        n = len(self._scaled)
        if steps == 0:
            return [0] * n
        self._seek(steps - 1)
        if self._in_period(steps - 1):
            assert self._period is not None
            first, period, before, per_period = self._period
            whole, part = divmod(steps - first, period.shape[0])
            partial = np.bincount(period[:part], minlength=n).tolist()
            return [b + whole * p + q for b, p, q in zip(before, per_period, partial, strict=True)]
        partial = np.bincount(self._block[: steps - self._block_start], minlength=n).tolist()
        return [b + q for b, q in zip(self._block_counts, partial, strict=True)]
