"""The packer contract: a node yielding packed sequences of ``seq_len + 1`` slots."""

from __future__ import annotations

import numpy as np

from shardtok.stream.masked import split_flags
from shardtok.stream.nodes.base import Node
from shardtok.stream.options import OVERLONG
from shardtok.stream.sequence import PackedSequence


class Packer(Node[PackedSequence]):
    """A node that yields packed sequences of ``window = seq_len + 1`` slots.

    Besides iteration (fresh ``PackedSequence`` objects), ``next_into(row)`` writes the next
    sequence straight into a caller's row (the batcher's), saving a copy per token; both paths
    produce the same sequences and advance the same state.

    A ``masked`` packer's documents carry their loss masks as flag bits (``stream.masked``):
    it moves them like any tokens, and the sequences it yields carry the mask again.
    """

    window: int
    dtype: np.dtype | None = None  # of the documents, known once one was read
    masked: bool = False

    def _take(self, upstream, seq_len: int, masked: bool) -> None:
        """What every packer's constructor starts with: its upstream, its window, the mask flag."""
        super().__init__()
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        self.upstream = upstream
        self.window = seq_len + 1
        self.masked = masked

    @property
    def row_masked(self) -> bool:
        """Whether the sequence just emitted is fine-tuning data (its documents have masks):
        such rows never train a label across a document boundary. A mix answers per row."""
        return self.masked

    @property
    def row_source(self) -> int:
        """The source id of the sequence just emitted (a batch's ``source_ids``): 0 for one
        dataset; a mix answers per row with its sources' ids."""
        return 0

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
        return packed_sequence(out, starts, length, self.masked)

    def _prepare(self) -> bool:
        """Read until the next sequence is complete; False at the end of the stream."""
        raise NotImplementedError

    def _emit_into(self, out: np.ndarray) -> tuple[list[int], int]:
        raise NotImplementedError

    # -- what elastic resume needs (shardtok.stream.remainder) -------------------------
    @classmethod
    def residual_tokens(cls, state: dict, total: int, stride: int, real_tokens: int) -> int:
        """Tokens of a `total`-token slice not in a sequence yielded before `state`, of which
        `real_tokens` were yielded: every real token yielded is one fewer left (packers that
        pad; concat, whose windows overlap with a stride, overrides this)."""
        cls.parse_state(state)
        return max(0, total - real_tokens)


def packed_sequence(row: np.ndarray, starts: list[int], length: int, masked: bool):
    """A ``PackedSequence`` of a written row; a masked row's flags become its mask (padding:
    0, never trained)."""
    if not masked:
        return PackedSequence(row, starts, length)
    tokens, mask = split_flags(row)
    mask[length:] = 0
    return PackedSequence(tokens, starts, length, mask)


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
