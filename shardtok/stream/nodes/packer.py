"""The packer contract: a node yielding packed sequences of ``seq_len + 1`` slots."""

from __future__ import annotations

import numpy as np

from shardtok.stream.masked import MaskedTokens, Row, empty_row
from shardtok.stream.nodes.base import Node
from shardtok.stream.sequence import PackedSequence

OVERLONG = ("split", "drop", "truncate")


class Packer(Node[PackedSequence]):
    """A node that yields packed sequences of ``window = seq_len + 1`` slots.

    Besides iteration (fresh ``PackedSequence`` objects), ``next_into(row)`` writes the next
    sequence straight into a caller's row (the batcher's), saving a copy per token; both paths
    produce the same sequences and advance the same state.

    A ``masked`` packer reads ``MaskedTokens`` documents and writes into ``MaskedTokens`` rows
    (tokens and loss mask side by side); an unmasked one reads and writes plain arrays.
    """

    window: int
    dtype: np.dtype | None = None  # of the documents, known once one was read
    masked: bool = False

    @property
    def row_masked(self) -> bool:
        """Whether the sequence just emitted is fine-tuning data (its documents have masks):
        such rows never train a label across a document boundary. A mix answers per row."""
        return self.masked

    def next_into(self, out: Row) -> tuple[list[int], int]:
        """Write the next sequence into `out` (``window`` slots); return (starts, length)."""
        if not self._started:
            self.reset(None)
        if not self._prepare():
            raise StopIteration
        return self._emit_into(out)

    def _next(self) -> PackedSequence:
        if not self._prepare():
            raise StopIteration
        out = empty_row(self.window, self.dtype, self.masked)
        starts, length = self._emit_into(out)
        if isinstance(out, MaskedTokens):
            return PackedSequence(out.tokens, starts, length, out.mask)
        return PackedSequence(out, starts, length)

    def _prepare(self) -> bool:
        """Read until the next sequence is complete; False at the end of the stream."""
        raise NotImplementedError

    def _emit_into(self, out: Row) -> tuple[list[int], int]:
        raise NotImplementedError

    # -- what elastic resume needs (shardtok.stream.resume.elastic) -------------------------
    @classmethod
    def residual_tokens(cls, state: dict, total: int, stride: int, real_tokens: int) -> int:
        """Tokens of a `total`-token slice not in a sequence yielded before `state`, of which
        `real_tokens` were yielded: every real token yielded is one fewer left (packers that
        pad; concat, whose windows overlap with a stride, overrides this)."""
        cls.parse_state(state)
        return max(0, total - real_tokens)


class OverlongCount:
    """Documents longer than a sequence, as a padding packer met them (this process only; the
    epoch plan counts the whole epoch's exactly): how many, and the tokens dropped."""

    def __init__(self, mode: str):
        if mode not in OVERLONG:
            raise ValueError(f"overlong must be one of {OVERLONG}, got {mode!r}")
        self.mode = mode
        self.documents = 0
        self.dropped = 0

    def keep(self, length: int, window: int) -> int:
        """How many leading tokens of a document of `length` tokens to pack (all of them when
        splitting, which cuts long ones into full sequences; none to drop one)."""
        if length <= window:
            return length
        self.documents += 1
        if self.mode == "split":
            return length
        kept = window if self.mode == "truncate" else 0
        self.dropped += length - kept
        return kept

    def stats(self) -> dict:
        return {
            "overlong": self.mode,
            "overlong_documents": self.documents,
            "overlong_tokens_dropped": self.dropped,
        }
