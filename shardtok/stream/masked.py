"""Tokens that travel with their loss mask: what a masked (fine-tuning) dataset's documents are.

A ``MaskedTokens`` pairs a token array with a same-length uint8 mask (1: the token is a training
target) and answers the few array operations the stream nodes use on documents and rows --
``len``, slicing, ``dtype``, and writing a slice from another ``MaskedTokens`` or a scalar --
so the reader, the shuffle buffer, the packers and elastic resume move masked documents through
the very code that moves plain ones: a slice of a document is a slice of both arrays, a packed
row is written column range by column range into both. Maskless data stays plain ndarrays, so
its hot path builds no masks at all.

Writing a scalar (padding) sets the tokens to it and the mask to 0: padding is never trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import starmap

import numpy as np

MASK_DTYPE = np.dtype(np.uint8)


class MaskedTokens:
    __slots__ = ("tokens", "mask")

    def __init__(self, tokens: np.ndarray, mask: np.ndarray):
        self.tokens = tokens
        self.mask = mask

    @classmethod
    def empty(cls, length: int, dtype) -> MaskedTokens:
        return cls(np.empty(length, dtype=dtype), np.empty(length, dtype=MASK_DTYPE))

    @property
    def dtype(self) -> np.dtype:
        return self.tokens.dtype

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: slice) -> MaskedTokens:
        return MaskedTokens(self.tokens[index], self.mask[index])

    def __setitem__(self, index: slice, value: MaskedTokens | int) -> None:
        if isinstance(value, MaskedTokens):
            self.tokens[index] = value.tokens
            self.mask[index] = value.mask
        else:
            self.tokens[index] = value
            self.mask[index] = 0

    def __repr__(self) -> str:
        return f"MaskedTokens(tokens={self.tokens!r}, mask={self.mask!r})"


Row = np.ndarray | MaskedTokens  # what a packer writes a sequence into


def pair_documents(pairs):
    """(tokens, mask) pairs, as the shard readers yield them, as MaskedTokens (one C-level
    step per document, no generator frame)."""
    return starmap(MaskedTokens, pairs)


def empty_row(length: int, dtype, masked: bool) -> Row:
    return MaskedTokens.empty(length, dtype) if masked else np.empty(length, dtype=dtype)


def concatenate(pieces: Sequence[Row]) -> Row:
    """``np.concatenate`` for plain or masked pieces (all of one kind)."""
    if isinstance(pieces[0], MaskedTokens):
        return MaskedTokens(
            np.concatenate([p.tokens for p in pieces]),  # type: ignore[union-attr]
            np.concatenate([p.mask for p in pieces]),  # type: ignore[union-attr]
        )
    return np.concatenate(pieces)  # type: ignore[arg-type]


def concatenate_into(pieces: Sequence[Row], out: Row) -> None:
    """Write `pieces` end to end into `out` (as long as they are together)."""
    if isinstance(out, MaskedTokens):
        np.concatenate([p.tokens for p in pieces], out=out.tokens, casting="unsafe")  # type: ignore[union-attr]
        np.concatenate([p.mask for p in pieces], out=out.mask)  # type: ignore[union-attr]
    else:
        np.concatenate(pieces, out=out, casting="unsafe")  # type: ignore[arg-type]
