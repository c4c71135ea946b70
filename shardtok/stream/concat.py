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
"""

from __future__ import annotations

from collections import deque

import numpy as np

from shardtok.stream.node import DocumentNode
from shardtok.stream.sequence import PackedSequence, Packer


def concat_window_count(num_tokens: int, seq_len: int, stride: int | None = None) -> int:
    """How many windows concat packing cuts from `num_tokens` consecutive tokens."""
    window = seq_len + 1
    stride = window if stride is None else stride
    return 0 if num_tokens < window else (num_tokens - window) // stride + 1


class ConcatPacker(Packer):
    """Cuts the document stream of `upstream` into windows of ``seq_len + 1`` tokens.

    Documents are appended to one reused token buffer; a window is a copy of a slice of it.

    State: the upstream state just before the document holding the next window's first token,
    the offset of that token in it, and the number of windows emitted.
    """

    def __init__(self, upstream: DocumentNode, seq_len: int, stride: int | None = None):
        super().__init__()
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        self.upstream = upstream
        self.window = seq_len + 1
        self.stride = self.window if stride is None else int(stride)
        if not 1 <= self.stride <= self.window:
            raise ValueError(f"stride must lie in [1, seq_len + 1 = {self.window}], got {stride}")
        self._buf = np.empty(0, dtype=np.int32)
        self._base = 0  # token number (counted from the reset point) of _buf[0]
        self._end = 0  # token number one past the last buffered token
        self._head = 0  # token number of the next window's first token
        # Documents from the one holding _head on: (token number of their start, position).
        self._docs: deque[tuple[int, int]] = deque()
        self._emitted = 0
        self._exhausted = False
        self._pull_next = upstream.__next__  # replaced by the faster _next once started

    def _reset(self, state: dict | None) -> None:
        self._buf = np.empty(0, dtype=np.int32)
        self._base = self._end = 0
        self._docs.clear()
        self._exhausted = False
        if state is None:
            self.upstream.reset(None)
            self._head = 0
            self._emitted = 0
        else:
            self.upstream.reset(state["upstream"])
            self._head = int(state["skip"])
            self._emitted = int(state["emitted"])
        self._pull_next = self.upstream._next  # started by the reset above

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        if self._head >= self._end:  # nothing buffered is needed: continue with the next pull
            position, skip = self.upstream.position, self._head - self._end
        else:
            start, position = self._head_document()
            skip = self._head - start
        return {
            "upstream": self.upstream.state_at(position),
            "skip": skip,
            "emitted": self._emitted,
        }

    def _append(self, doc: np.ndarray, position: int) -> None:
        n = len(doc)
        if self._buf.dtype != doc.dtype or self._end + n - self._base > len(self._buf):
            # Keep only what the next window needs, at the front of the buffer; a new buffer
            # only when it is too small (fresh memory costs page faults on every batch).
            keep = max(self._end - self._head, 0)
            live = self._buf[max(self._head, self._base) - self._base : self._end - self._base]
            if self._buf.dtype != doc.dtype or keep + n > len(self._buf):
                fresh = np.empty(max(4 * self.window, 2 * (keep + n), 1 << 16), dtype=doc.dtype)
                fresh[:keep] = live
                self._buf = fresh
            elif keep:
                self._buf[:keep] = live  # numpy copies overlapping ranges correctly
            self._base = self._end - keep
        at = self._end - self._base
        self._buf[at : at + n] = doc
        self._docs.append((self._end, position))
        self._end += n

    def _head_document(self) -> tuple[int, int]:
        """(start, position) of the document holding the next window's first token."""
        docs = self._docs
        while len(docs) > 1 and docs[1][0] <= self._head:
            docs.popleft()
        return docs[0]

    def _next(self) -> PackedSequence:
        window = self.window
        head = self._head
        while self._end - head < window:
            if self._exhausted:
                raise StopIteration
            position = self.upstream.position
            try:
                doc = self._pull_next()
            except StopIteration:
                self._exhausted = True
                raise
            if len(doc):
                self._append(doc, position)
        self._head_document()
        docs = self._docs
        starts = [0]
        limit = head + window
        for i in range(1, len(docs)):
            begin = docs[i][0]
            if begin >= limit:
                break
            starts.append(begin - head)
        at = head - self._base
        tokens = self._buf[at : at + window].copy()  # the buffer is reused
        self._head = head + self.stride
        self._emitted += 1
        return PackedSequence(tokens, starts, window)
