"""Concat packing: documents joined end to end (each keeps the EOS convert wrote) and cut into
windows of ``seq_len + 1`` tokens, Megatron style.

``stride`` is the distance between the starts of consecutive windows:

* ``seq_len + 1`` (the default): windows share no token, every token is an input or a target
  of exactly one window;
* ``seq_len``: Megatron's GPTDataset layout, where the last token of a window (a target only)
  is the first input of the next, so every token but the very first is a target once;
* anything smaller: overlapping sliding windows (reference note 004), each token seen several
  times.

A slice of T tokens gives ``(T - L) // stride + 1`` windows (``L = seq_len + 1``, none when
T < L); the tail that does not fill a window is left unread (the epoch plan counts it).
Masked documents are cut the same way: their masks are flag bits of their tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.nodes.base import DocumentNode
from shardtok.stream.nodes.packer import Packer

# Documents pulled per upstream call: a run the reader and the shuffle hand over whole.
_PULL_RUN = 32


class ConcatPacker(Packer):
    """Cuts the document stream of `upstream` into windows of ``seq_len + 1`` tokens.

    State: the upstream state just before the document holding the next window's first token,
    the offset of that token in it, and the number of windows emitted.
    """

    KIND = "concat"
    FIELDS = {"upstream": envelope.STATE, "skip": envelope.INT, "emitted": envelope.INT}

    def __init__(
        self,
        upstream: DocumentNode,
        seq_len: int,
        stride: int | None = None,
        *,
        masked: bool = False,
    ):
        self._take(upstream, seq_len, masked)
        self.stride = self.window if stride is None else int(stride)
        if not 1 <= self.stride <= self.window:
            raise ValueError(f"stride must lie in [1, seq_len + 1 = {self.window}], got {stride}")
        # Documents still (partly) needed: (upstream position before the pull, tokens).
        self._pending: deque[tuple[int, np.ndarray]] = deque()
        self._available = 0  # tokens in _pending
        self._offset = 0  # next window's first token, relative to the first pending document
        self._emitted = 0
        self._skip_unchecked = False
        self._exhausted = False
        self._next_position = 0  # upstream position when _pending is empty

    def _reset(self, state: dict | None) -> None:
        self._pending.clear()
        self._available = 0
        self._exhausted = False
        if state is None:
            self.upstream.reset(None)
            self._offset = 0
            self._emitted = 0
        else:
            state = self.parse_state(state)
            self.upstream.reset(state["upstream"])
            self._offset = state["skip"]
            self._emitted = state["emitted"]
        self._skip_unchecked = state is not None and self._offset > 0
        self._next_position = self.upstream.position
        self._pull_many = self.upstream._next_many  # started by the reset above

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        first = self._pending[0][0] if self._pending else self._next_position
        return self._wrap(
            upstream=self.upstream.state_at(first), skip=self._offset, emitted=self._emitted
        )

    # -- what elastic resume needs (shardtok.stream.remainder) ---------------------
    @classmethod
    def residual_tokens(cls, state: dict, total: int, stride: int, real_tokens: int) -> int:
        """Tokens of a `total`-token slice not in any window yielded before `state`."""
        return max(0, total - cls.parse_state(state)["emitted"] * stride)

    @classmethod
    def residual_documents(
        cls, state: dict, documents: DocumentNode, overlong: str = "split"
    ) -> Iterator[np.ndarray]:
        """From `state` on, the tokens not yet in a yielded window, document by document
        (`overlong` does not apply: concat cuts every document)."""
        state = cls.parse_state(state)
        documents.reset(state["upstream"])
        first = next(documents, None)
        if first is not None:
            yield first[state["skip"] :]
        yield from documents

    def _prepare(self) -> bool:
        return self._fill(self._offset + self.window)

    def _fill(self, end: int) -> bool:
        """Pull documents until `end` tokens (counted from the first pending one) are held.

        Documents come in small runs (one call per run, not per document); the few pulled
        beyond `end` simply stay pending, which changes neither the windows nor the state."""
        pending = self._pending
        while self._available < end:
            if self._exhausted:
                return False
            position = self.upstream.position
            docs = self._pull_many(_PULL_RUN)
            if len(docs) < _PULL_RUN:
                self._exhausted = True
            sizes = list(map(len, docs))
            if all(sizes):  # the usual run: no empty document, no Python step per document
                pending.extend(zip(range(position, position + len(docs)), docs))
                self._available += sum(sizes)
            else:
                for doc, size in zip(docs, sizes):
                    position += 1
                    if size:
                        pending.append((position - 1, doc))
                        self._available += size
                    elif not pending:  # an empty document is never a window start
                        self._next_position = position
            if self.dtype is None and pending:
                self.dtype = pending[0][1].dtype
            self._check_skip()
        return True

    def _check_skip(self) -> None:
        # A saved skip is always inside the document the state names (a window that reaches a
        # document's end moves to the next one); past it, the rows would not be this stream's.
        if self._skip_unchecked and self._pending:
            self._skip_unchecked = False
            if self._offset >= len(self._pending[0][1]):
                raise ResumeStateError(
                    f"concat state: field 'skip' is {self._offset}, but the document it names "
                    f"holds {len(self._pending[0][1])} tokens"
                )

    @property
    def contiguous(self) -> bool:
        """Whether consecutive windows are consecutive token runs (no overlap), so a whole
        batch can be cut in one go by `next_batch`."""
        return self.stride == self.window

    def next_batch(self, rows: int) -> tuple[list[np.ndarray], list[int]] | None:
        """The next `rows` windows as one flat run of ``rows * window`` tokens, given as the
        pieces of documents that make it up end to end (views: the batch builder reads them
        where they lie instead of a concatenated copy), and the flat positions (ascending, in
        ``(0, rows * window)``) where later documents begin. None, with nothing emitted, when
        the stream cannot fill them all.

        Same windows and same state afterwards as `rows` calls of `next_into`; only for
        contiguous windows. Per-window calls cost more Python than the copy itself.
        """
        if not self._started:
            self.reset(None)
        span = rows * self.window
        if not self._fill(self._offset + span):
            return None
        # _pieces and _advance in one pass: the documents used up are dropped as they are cut.
        pending = self._pending
        offset = self._offset
        pieces: list[np.ndarray] = []
        boundaries: list[int] = []
        filled = 0
        while True:
            doc = pending[0][1]
            size = len(doc)
            rest = span - filled
            if size - offset > rest:  # the document goes on into the next batch
                pieces.append(doc[offset : offset + rest])
                offset += rest
                break
            pieces.append(doc[offset:] if offset else doc)
            filled += size - offset
            offset = 0
            pending.popleft()
            self._available -= size
            if filled == span:
                break
            boundaries.append(filled)
        self._offset = offset
        if not pending:
            self._next_position = self.upstream.position
        self._emitted += rows
        return pieces, boundaries

    def pass_windows(self, rows: int, run_tokens: int = 1 << 22) -> int:
        """Pass over up to `rows` contiguous windows without building them, about `run_tokens`
        tokens per step (runs halve near the end of the data); returns the windows passed,
        fewer only where the data ends. Same state afterwards as that many `next_into` calls:
        how a provenance trace gets past the rows before its step."""
        if not self._started:
            self.reset(None)
        run = max(1, run_tokens // self.window)
        done = 0
        while done < rows:
            take = min(run, rows - done)
            if self._fill(self._offset + take * self.window):
                self._advance(take * self.window, take)
                done += take
            elif take > 1:
                run = take // 2
            else:
                break
        return done

    def _pieces(self, span: int) -> tuple[list[np.ndarray], list[int]]:
        """The next `span` tokens (held by now) as slices of the pending documents, and where
        in the span each document after the first begins."""
        offset = self._offset
        pieces = []
        boundaries = []
        filled = 0
        for _, doc in self._pending:
            if filled:
                boundaries.append(filled)
            piece = doc[offset : offset + span - filled]
            pieces.append(piece)
            filled += len(piece)
            offset = 0
            if filled == span:
                break
        return pieces, boundaries

    def _advance(self, tokens: int, windows: int) -> None:
        """Move the next window's start `tokens` on, dropping the documents it is past."""
        pending = self._pending
        self._offset += tokens
        while pending and self._offset >= len(pending[0][1]):
            _, doc = pending.popleft()
            self._offset -= len(doc)
            self._available -= len(doc)
        if not pending:
            self._next_position = self.upstream.position
        self._emitted += windows

    def _emit_into(self, out: np.ndarray) -> tuple[list[int], int]:
        window = self.window
        offset = self._offset
        pending = self._pending
        first = pending[0][1]
        if offset + window <= len(first):  # inside one document
            out[:] = first[offset : offset + window]
            starts = [0]
        else:
            pieces, later = self._pieces(window)
            starts = [0, *later]  # every later document begins inside this window
            np.concatenate(pieces, out=out, casting="unsafe")
        self._advance(self.stride, 1)
        return starts, window
