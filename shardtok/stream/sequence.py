"""A packed training sequence: what both packers yield and the batcher consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class PackedSequence:
    """``seq_len + 1`` tokens: inputs are ``tokens[:-1]``, targets are ``tokens[1:]``.

    ``starts`` lists where document segments begin (``starts[0] == 0``; a window that begins
    mid-document starts a segment too, since nothing before it is visible). Tokens from
    ``length`` on are padding (greedy packing only). ``mask`` (uint8, one per token; None for
    data without loss masks, which counts as all trained) is the documents' loss masks as
    stored: the batch builder turns it into labels, adding the document-boundary rule.
    """

    tokens: np.ndarray
    starts: list[int]
    length: int
    mask: np.ndarray | None = None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PackedSequence)
            and self.length == other.length
            and list(self.starts) == list(other.starts)
            and np.array_equal(self.tokens, other.tokens)
            and (self.mask is None) == (other.mask is None)
            and (self.mask is None or np.array_equal(self.mask, other.mask))
        )
