"""Greedy packing: whole documents placed into sequences of ``seq_len + 1`` slots, tail padded.

Each document goes into the first of up to ``lookahead`` open sequences with room for it
(first fit); when none has room and all are open, the oldest is closed and emitted. A sequence
that fills up exactly is emitted at once. A document longer than ``seq_len + 1`` tokens is
handled by ``overlong``: ``split`` cuts it (its full ``seq_len + 1``-token pieces become sequences
of their own, the remainder is placed like any document), ``truncate`` keeps its first
``seq_len + 1`` tokens as a sequence of their own, ``drop`` leaves it out. A sequence holds at
most ``seq_len + 1`` real tokens, so a slice of T tokens, K of them kept, always yields at least
``ceil(K / (seq_len + 1))`` sequences (the epoch plan relies on this and counts K).

State: the open and finished-but-unemitted sequences are described by the upstream positions
and token ranges of the documents in them (a few integers each), plus the upstream state at the
oldest of those documents. Restoring re-reads the documents from there and rebuilds them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.nodes.base import DocumentNode
from shardtok.stream.nodes.packer import OverlongCount, Packer

# An open sequence whose first document is this many documents old is closed, so the state
# never reaches further back than document nodes remember (options.HISTORY).
MAX_OPEN_AGE = 4096

# One placed piece of a document: (upstream position, first token, end token).
Ref = tuple[int, int, int]


class _Bin:
    __slots__ = ("refs", "pieces", "used")

    def __init__(self) -> None:
        self.refs: list[Ref] = []
        self.pieces: list[np.ndarray] = []
        self.used = 0

    def add(self, ref: Ref, piece: np.ndarray) -> None:
        self.refs.append(ref)
        self.pieces.append(piece)
        self.used += len(piece)


class GreedyPacker(Packer):
    KIND = "greedy"
    FIELDS = {
        "upstream": envelope.STATE,
        "position": envelope.INT,
        "open": envelope.LIST,
        "ready": envelope.LIST,
        "long": envelope.ANY,
        "emitted": envelope.INT,
        "exhausted": envelope.BOOL,
    }

    def __init__(
        self,
        upstream: DocumentNode,
        seq_len: int,
        *,
        lookahead: int = 8,
        pad_id: int = 0,
        overlong: str = "split",
        masked: bool = False,
    ):
        self._take(upstream, seq_len, masked)
        self.overlong = OverlongCount(overlong)
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, got {lookahead}")
        self.lookahead = lookahead
        self.pad_id = int(pad_id)
        self._open: list[_Bin] = []
        self._ready: deque[_Bin] = deque()
        # A document longer than the window, cut lazily: (position, tokens, next start).
        self._long: tuple[int, np.ndarray, int] | None = None
        self._emitted = 0
        self._exhausted = False

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        bins = [[list(r) for r in b.refs] for b in self._open]
        ready = [[list(r) for r in b.refs] for b in self._ready]
        held = [r[0] for b in (*self._open, *self._ready) for r in b.refs]
        if self._long is not None:
            held.append(self._long[0])
        position = self.upstream.position
        oldest = min(held, default=position)
        return self._wrap(
            upstream=self.upstream.state_at(oldest),
            position=position,
            open=bins,
            ready=ready,
            long=None if self._long is None else [self._long[0], self._long[2]],
            emitted=self._emitted,
            exhausted=self._exhausted,
        )

    @classmethod
    def parse_state(cls, state: object) -> dict:
        state = super().parse_state(state)
        for field in ("open", "ready"):
            for refs in state[field]:
                if not isinstance(refs, list):
                    raise ResumeStateError(f"greedy state: field {field!r} must hold lists")
                for ref in refs:
                    envelope.non_negative_ints(cls.KIND, field, ref, 3)
                    if not ref[0] < state["position"]:
                        raise ResumeStateError(
                            f"greedy state: field {field!r} names document {ref[0]}, at or "
                            f"past the packer's position {state['position']}"
                        )
        if state["long"] is not None:
            envelope.non_negative_ints(cls.KIND, "long", state["long"], 2)
            if not state["long"][0] < state["position"]:
                raise ResumeStateError(
                    f"greedy state: field 'long' names document {state['long'][0]}, at or past "
                    f"the packer's position {state['position']}"
                )
        return state

    # -- what elastic resume needs (shardtok.stream.remainder) ---------------------
    @classmethod
    def residual_documents(
        cls, state: dict, documents: DocumentNode, overlong: str = "split"
    ) -> Iterator[np.ndarray]:
        """The pieces held in open and unyielded sequences, then every later document (whole:
        the packer that takes them applies `overlong` again)."""
        state = cls.parse_state(state)
        documents.reset(state["upstream"])
        wanted: dict[int, list[tuple[int, int | None]]] = {}
        for sequence in (*state["open"], *state["ready"]):
            for pos, start, stop in sequence:
                wanted.setdefault(pos, []).append((start, stop))
        if state["long"] is not None:
            wanted.setdefault(state["long"][0], []).append((state["long"][1], None))
        while documents.position < state["position"]:
            pos = documents.position
            doc = next(documents)
            for start, stop in sorted(wanted.get(pos, []), key=lambda r: r[0]):
                yield doc[start:stop]
        yield from documents

    def _reset(self, state: dict | None) -> None:
        self._open = []
        self._ready = deque()
        self._long = None
        if state is None:
            self.upstream.reset(None)
            self._emitted = 0
            self._exhausted = False
            return
        state = self.parse_state(state)
        self.upstream.reset(state["upstream"])
        self._emitted = state["emitted"]
        wanted: dict[int, list[tuple[_Bin, int, int]]] = {}
        open_bins = [_Bin() for _ in state["open"]]
        ready_bins = [_Bin() for _ in state["ready"]]
        for bins, refs_list in ((open_bins, state["open"]), (ready_bins, state["ready"])):
            for b, refs in zip(bins, refs_list):
                for pos, start, stop in refs:
                    wanted.setdefault(int(pos), []).append((b, int(start), int(stop)))
        long_ref = state["long"]
        target = int(state["position"])
        # Re-read every document from the oldest one still held; pieces go back into their
        # sequences in the order they were placed (refs are replayed per bin below).
        docs: dict[int, np.ndarray] = {}
        while self.upstream.position < target:
            pos = self.upstream.position
            try:
                doc = self.upstream._next()  # started by reset
            except StopIteration:
                raise ResumeStateError(
                    f"greedy packer state refers to document {pos}, but the stream ends there"
                ) from None
            if pos in wanted or (long_ref is not None and pos == long_ref[0]):
                docs[pos] = doc
                self._note_dtype(doc)
        for bins, refs_list in ((open_bins, state["open"]), (ready_bins, state["ready"])):
            for b, refs in zip(bins, refs_list):
                for pos, start, stop in refs:
                    b.add((int(pos), int(start), int(stop)), docs[int(pos)][int(start) : int(stop)])
        self._open = open_bins
        self._ready = deque(ready_bins)
        if long_ref is not None:
            self._long = (int(long_ref[0]), docs[int(long_ref[0])], int(long_ref[1]))
        self._exhausted = bool(state["exhausted"])

    # -- packing ------------------------------------------------------------------------
    def _note_dtype(self, doc: np.ndarray) -> None:
        if self.dtype is None:
            self.dtype = doc.dtype

    def _place(self, ref: Ref, piece: np.ndarray) -> None:
        n = len(piece)
        while self._open and self._open[0].refs[0][0] < ref[0] - MAX_OPEN_AGE:
            self._ready.append(self._open.pop(0))
        for i, b in enumerate(self._open):
            if self.window - b.used >= n:
                b.add(ref, piece)
                if b.used == self.window:
                    self._ready.append(self._open.pop(i))
                return
        if len(self._open) >= self.lookahead:
            self._ready.append(self._open.pop(0))
        b = _Bin()
        b.add(ref, piece)
        if b.used == self.window:
            self._ready.append(b)
        else:
            self._open.append(b)

    def _step(self) -> bool:
        """Do one unit of work; False when the upstream is exhausted and nothing is left."""
        if self._long is not None:
            pos, doc, start = self._long
            if len(doc) - start > self.window:
                b = _Bin()
                b.add((pos, start, start + self.window), doc[start : start + self.window])
                self._ready.append(b)
                self._long = (pos, doc, start + self.window)
            else:
                self._long = None
                self._place((pos, start, len(doc)), doc[start:])
            return True
        if self._exhausted:
            if not self._open:
                return False
            self._ready.append(self._open.pop(0))
            return True
        pos = self.upstream.position
        try:
            doc = self.upstream._next()  # started by reset
        except StopIteration:
            self._exhausted = True
            return True
        size = len(doc)
        n = size if size <= self.window else self.overlong.keep(size, self.window)
        if n == 0:
            return True
        self._note_dtype(doc)
        if n > self.window:
            self._long = (pos, doc, 0)
        else:
            self._place((pos, 0, n), doc[:n] if n < size else doc)
        return True

    def _prepare(self) -> bool:
        while not self._ready:
            if not self._step():
                return False
        return True

    def _emit_into(self, out: np.ndarray) -> tuple[list[int], int]:
        b = self._ready.popleft()
        self._emitted += 1
        starts = []
        at = 0
        for piece in b.pieces:
            starts.append(at)
            out[at : at + len(piece)] = piece
            at += len(piece)
        out[at:] = self.pad_id
        return starts, at
