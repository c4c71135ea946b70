"""Cutting a run of token ranges into equal slices: the one rule the epoch plan and elastic
resume share.

The ranges are joined end to end (T tokens) and cut at offsets ``j * T // count``, so slice sizes
differ by at most one token and a range cut there becomes two.
"""

from __future__ import annotations

import numpy as np


def cut_ranges(lengths, count: int) -> list[tuple[int, int, tuple[tuple[int, int, int], ...]]]:
    """Per slice: its (start, stop) in the joined stream and its (range index, lo, hi) parts,
    lo/hi relative to the range's own start."""
    sizes = np.asarray(lengths, dtype=np.int64)
    begins = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=begins[1:])
    total = int(begins[-1])
    out = []
    for s in range(count):
        a, b = slice_bounds(s, total, count)
        parts = []
        j = int(np.searchsorted(begins, a, side="right")) - 1
        while j < len(sizes) and begins[j] < b:
            lo = max(a, int(begins[j])) - int(begins[j])
            hi = min(b, int(begins[j + 1])) - int(begins[j])
            if hi > lo:
                parts.append((j, lo, hi))
            j += 1
        out.append((a, b, tuple(parts)))
    return out


def slice_bounds(s: int, total: int, count: int) -> tuple[int, int]:
    """Token range [a, b) of slice `s` of `count` equal slices of `total` tokens (the epoch
    plan and elastic resume cut by this one rule)."""
    return s * total // count, (s + 1) * total // count
