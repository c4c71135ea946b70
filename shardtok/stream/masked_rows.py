"""A masked batch's inputs, labels and trained count from its flagged token rows
(``stream.masked``): the compiled pass where it was built, else its numpy twin.

Why compiled: numpy takes five passes over the rows (the flag cleared, negative targets made
-100, boundaries and padding set, the count) for what a maskless batch does in two widening
copies, 10.5 against 4.1 µs for 8 x 2049 tokens, and in one process that was a masked concat
stream's whole extra main-thread cost (issue 18: 81% of the unmasked throughput, no numpy
formulation better). ``_rows.c`` does it in one pass (5.0 µs). It is optional at install
(no C compiler: the twin runs), and the twin stays the reference it is tested against
(tests/stream/test_masked_kernel.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardtok.stream.masked import IGNORE_INDEX, VALUES

try:  # compiled at install where a C compiler is found (pyproject.toml: optional)
    from shardtok.stream._rows import rows as _rows_kernel
except ImportError:  # pragma: no cover - a build without a compiler: the numpy twin below
    _rows_kernel = None


_CONSTANTS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _constants(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Read-only arrays of -100 and of VALUES: numpy's binary loops are vectorized against an
    array, not against a scalar (1.8 µs against 6 µs for a batch's ``maximum``, measured when
    the twin still used one)."""
    key = (shape, dtype.char)
    out = _CONSTANTS.get(key)
    if out is None:
        out = _CONSTANTS[key] = (np.full(shape, IGNORE_INDEX, dtype), np.full(shape, VALUES, dtype))
        for array in out:
            array.flags.writeable = False
    return out


def masked_rows(
    input_ids: np.ndarray,
    labels: np.ndarray,
    grid: np.ndarray,
    ignored: list[int],
    labels_format: str,
    padded: Sequence[tuple[int, int]] = (),
) -> int:
    """Write the inputs and labels of flagged token rows `grid` [B, S + 1] (``stream.masked``)
    into `input_ids` and `labels` [B, S] and return how many labels are trained: -100 where a
    target is untrained, at the flat `grid` positions `ignored` (targets that begin a
    document, distinct), from column `c` on in each `padded` row ``(b, c)`` and, for hf, in
    column 0.

    int32 rows go through the compiled kernel; int64 rows (a mix) and every batch where no
    compiler was at install time take the numpy twin (see the module docstring)."""
    if (
        _rows_kernel is None
        or grid.dtype != np.int32
        or not (grid.flags.c_contiguous and input_ids.flags.c_contiguous)
        or not labels.flags.c_contiguous
    ):
        return masked_rows_numpy(input_ids, labels, grid, ignored, labels_format, padded)
    rows, window = grid.shape
    hf = labels_format == "hf"
    pad = None
    if padded:
        pad = np.full(rows, window, dtype=np.int64)
        for b, column in padded:
            pad[b] = column
    untrained = _rows_kernel(grid, input_ids, labels, pad, hf, ignored)
    targets = labels.size - (rows if hf else 0)
    return targets - untrained


def masked_rows_numpy(
    input_ids: np.ndarray,
    labels: np.ndarray,
    grid: np.ndarray,
    ignored: list[int],
    labels_format: str,
    padded: Sequence[tuple[int, int]] = (),
) -> int:
    """`masked_rows` with numpy alone (the kernel's twin).

    The work happens on the token rows (int32 in a stream: half the bytes of the outputs) in
    one scratch array: the flags cleared, then every flagged (negative) target set to -100 and
    the ignored targets too; each result reaches its int64 output in one widening copy, as
    unflagged tokens do. Writing the outputs first and fixing them there
    (a flag strip fused with the widening, a clamp and a count over the labels) cost twice the
    time (issue 18's profile).
    """
    dtype = grid.dtype if grid.dtype.kind == "i" else np.dtype(np.int64)
    floor, values = _constants(grid.shape, dtype)
    work = np.bitwise_and(grid, values)  # of `dtype`, as `values` is
    np.copyto(input_ids, work[:, :-1], casting="unsafe")
    # Every flagged (negative) target to -100: not max(token, -100), which keeps a flagged id
    # of 2**31 - 99 or more as a label in (-100, 0).
    np.copyto(work, floor, where=grid < 0)
    if ignored:
        work.reshape(-1)[ignored] = IGNORE_INDEX
    for b, column in padded:
        work[b, column:] = IGNORE_INDEX
    if labels_format == "shifted":
        np.copyto(labels, work[:, 1:], casting="unsafe")
        targets = labels.size
    else:  # hf: each target one column right; the last column's has no place
        np.copyto(labels[:, 1:], work[:, 1:-1], casting="unsafe")
        labels[:, 0] = IGNORE_INDEX
        targets = labels.size - len(labels)
        work[:, -1] = 0
    work[:, 0] = 0  # column 0 is an input only, no label: kept out of the count below
    return targets - int(np.count_nonzero(work == floor))
