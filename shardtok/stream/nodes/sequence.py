"""A packed training sequence: what both packers yield and the batcher consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardtok.stream.nodes.base import Node


@dataclass(slots=True)
class PackedSequence:
    """``seq_len + 1`` tokens: inputs are ``tokens[:-1]``, targets are ``tokens[1:]``.

    ``starts`` lists where document segments begin (``starts[0] == 0``; a window that begins
    mid-document starts a segment too, since nothing before it is visible). Tokens from
    ``length`` on are padding (greedy packing only).
    """

    tokens: np.ndarray
    starts: list[int]
    length: int

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PackedSequence)
            and self.length == other.length
            and list(self.starts) == list(other.starts)
            and np.array_equal(self.tokens, other.tokens)
        )


class Packer(Node[PackedSequence]):
    """A node that yields packed sequences of ``window = seq_len + 1`` slots.

    Besides iteration (fresh ``PackedSequence`` objects), ``next_into(row)`` writes the next
    sequence straight into a caller's row (the batcher's), saving a copy per token; both paths
    produce the same sequences and advance the same state.
    """

    window: int
    dtype: np.dtype | None = None  # of the documents, known once one was read

    def next_into(self, out: np.ndarray) -> tuple[list[int], int]:
        """Write the next sequence into `out` (``window`` slots); return (starts, length)."""
        if not self._started:
            self.reset(None)
        if not self._prepare():
            raise StopIteration
        return self._emit_into(out)

    def _next(self) -> PackedSequence:
        if not self._prepare():
            raise StopIteration
        out = np.empty(self.window, dtype=self.dtype)
        starts, length = self._emit_into(out)
        return PackedSequence(out, starts, length)

    def _prepare(self) -> bool:
        """Read until the next sequence is complete; False at the end of the stream."""
        raise NotImplementedError

    def _emit_into(self, out: np.ndarray) -> tuple[list[int], int]:
        raise NotImplementedError
