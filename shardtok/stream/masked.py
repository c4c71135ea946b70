"""How a loss mask travels with its tokens: as the sign of the token ids themselves.

A masked (fine-tuning) document reaches the stream as int32 token ids whose sign bit is set on
every token whose mask is 0 (an untrained token is negative: its id minus 2**31). The reader
sets the flags once per decoded frame, one vectorized pass; from there on a masked document is
a plain 1-D integer array, so the shuffle buffer, concat, greedy and bfd, mixes and elastic
resume move it -- slice it, cut it, concatenate it, write it into a row -- with exactly the
numpy calls that move maskless data, and a mask bit can never part from its token. The batch
builder works on the int32 token rows: it clears the bit for ``input_ids`` and turns every
negative target into -100 for ``labels``, widening both into their int64 outputs, in one
compiled pass (``_rows.c``) or its numpy twin (``masked_rows.masked_rows_numpy``).

Why not a (tokens, mask) pair per document: that cost a Python object and a second numpy call
for every slice, cut and copy of every document -- masked streaming ran at 60% of the unmasked
throughput that way (2 workers, 8 x 2048) -- where the flag costs one pass per ~1 MiB frame.

Data without masks carries no flag (every token trained) and is never touched: its documents
stay the reader's views of the decoded frame. Padding carries no flag either; the batch
builder masks padding by position. Token ids are at most 2**31 - 1 in any shardtok dtype, so
the sign is free.
"""

from __future__ import annotations

import numpy as np

VALUES = 0x7FFFFFFF  # the token id bits under the flag
IGNORE_INDEX = -100  # the label of a target no loss counts (PyTorch's and transformers' default)
FLAGGED_DTYPE = np.dtype(np.int32)


try:  # compiled at install where a C compiler is found (pyproject.toml: optional)
    from shardtok.stream._rows import flag as _flag_kernel
except ImportError:  # pragma: no cover - a build without a compiler: the numpy twin below
    _flag_kernel = None

_KERNEL_TOKENS = frozenset("BHiI")  # uint8, uint16, int32, uint32: what the kernel reads


def flag_untrained(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`tokens` (uint8, uint16 or int32 ids) as int32, negative where `mask` (uint8 0/1) is 0:
    a new array (`flag_frame` flags a frame the reader owns in place, and comes here for
    tokens it cannot write over). One compiled pass without the GIL where it was built (21
    against numpy's 57 µs per 256 k-token frame), else `flag_untrained_numpy`."""
    if (
        _flag_kernel is not None
        and tokens.dtype.char in _KERNEL_TOKENS
        and mask.dtype == np.uint8
        and tokens.ndim == mask.ndim == 1
        and tokens.flags.c_contiguous
        and mask.flags.c_contiguous
    ):
        out = np.empty(len(tokens), dtype=FLAGGED_DTYPE)
        _flag_kernel(tokens, mask, out)
        return out
    return flag_untrained_numpy(tokens, mask)


def flag_frame(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`flag_untrained` for a decoded frame (the stream reader's ``combine``): where the
    tokens are a writable 4-byte buffer -- the reader decodes a masked shard's frames into
    buffers of its own for this -- the flags are set in it, one bit OR per token, and it is
    returned as int32; else a new array. In place saves the second megabyte a frame took
    and the page faults of writing it fresh (a masked stream's decode thread is one of the
    two cores that bound it in one process)."""
    if not (
        tokens.flags.writeable
        and tokens.dtype.char in "iI"
        and tokens.ndim == 1
        and tokens.flags.c_contiguous
    ):
        return flag_untrained(tokens, mask)
    out = tokens.view(FLAGGED_DTYPE)
    if _flag_kernel is not None and mask.dtype == np.uint8 and mask.flags.c_contiguous:
        _flag_kernel(tokens, mask, out)
    else:
        flag_frame_numpy(out, mask)
    return out


def flag_frame_numpy(flagged: np.ndarray, mask: np.ndarray) -> None:
    """`flag_frame` in place with numpy alone (the kernel's twin): int32 `flagged` gets the
    sign bit where `mask` is 0."""
    flagged |= np.left_shift(mask ^ 1, 31, dtype=FLAGGED_DTYPE)


def flag_untrained_numpy(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`flag_untrained` with numpy alone (the kernel's twin): three passes."""
    out = np.left_shift(mask ^ 1, 31, dtype=FLAGGED_DTYPE)  # 1 << 31 is the int32 sign bit
    out |= tokens
    return out


def split_flags(flagged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, uint8 loss mask) of flagged tokens: the inverse of `flag_untrained`."""
    return flagged & VALUES, (flagged >= 0).view(np.uint8)
