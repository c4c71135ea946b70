"""The packer contract: a node yielding packed sequences of ``seq_len + 1`` slots."""

from __future__ import annotations

import numpy as np

from shardtok.stream.nodes.base import Node
from shardtok.stream.sequence import PackedSequence


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

    # -- what elastic resume needs (shardtok.stream.resume.elastic) -------------------------
    @classmethod
    def residual_tokens(cls, state: dict, total: int, stride: int, real_tokens: int) -> int:
        """Tokens of a `total`-token slice not in a sequence yielded before `state`, of which
        `real_tokens` were yielded: every real token yielded is one fewer left (packers that
        pad; concat, whose windows overlap with a stride, overrides this)."""
        cls.parse_state(state)
        return max(0, total - real_tokens)
