"""Best-fit-decreasing packing over a window of documents, online, tail padded.

The packer reads ``bfd_window`` documents, cuts each longer than ``seq_len + 1`` tokens into
full ``seq_len + 1``-token pieces (sequences of their own) plus a remainder (``overlong="split"``;
``truncate`` keeps only its first ``seq_len + 1`` tokens, ``drop`` none), and packs all
pieces best-fit-decreasing: longest first, each into the open sequence with the least room
that still fits it, a new one when none does. It emits that window's sequences, then reads the
next window. A sequence holds at most ``seq_len + 1`` real tokens, so a slice of T tokens always
yields at least ``ceil(T / (seq_len + 1))`` sequences, as greedy does (the epoch plan relies on
this).

The packing is a pure function of the window's documents, ties broken by document position,
so the state keeps no tokens: the upstream state at the window's first document and how many
of its sequences were emitted. Restoring re-reads (and re-packs) that one window.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.nodes.base import DocumentNode
from shardtok.stream.nodes.packer import OverlongCount, Packer
from shardtok.stream.options import HISTORY

# The window is re-read from the state at its first document, which document nodes can only
# describe HISTORY documents back.
MAX_BFD_WINDOW = HISTORY

# One placed piece of a document: (index in the window, first token, end token).
Ref = tuple[int, int, int]


def pack_bfd(lengths: Sequence[int], slots: int) -> list[list[Ref]]:
    """Best-fit-decreasing packing of documents of `lengths` into sequences of `slots` slots.

    Returns the sequences, each a list of pieces in document order, ordered by their first
    piece (so the emitted stream keeps roughly the upstream's order). Empty documents are left
    out. Ties (equal lengths, equal room) go to the earlier document and the older sequence.
    """
    pieces: list[Ref] = []
    for i, n in enumerate(lengths):
        full, rest = divmod(int(n), slots)
        pieces.extend((i, k * slots, (k + 1) * slots) for k in range(full))
        if rest:
            pieces.append((i, full * slots, n))
    pieces.sort(key=lambda r: (r[1] - r[2], r[0], r[1]))
    bins: list[list[Ref]] = []
    room: list[tuple[int, int]] = []  # (free slots, sequence index), sorted: best fit = bisect
    for ref in pieces:
        n = ref[2] - ref[1]
        at = bisect_left(room, (n, -1))
        if at < len(room):
            free, b = room.pop(at)
            bins[b].append(ref)
            if free > n:
                insort(room, (free - n, b))
        else:
            bins.append([ref])
            if slots > n:
                insort(room, (slots - n, len(bins) - 1))
    for b in bins:
        b.sort()
    bins.sort(key=lambda b: b[0])
    return bins


class BFDPacker(Packer):
    KIND = "bfd"
    FIELDS = {
        "upstream": envelope.STATE,  # at the current window's first document
        "window": envelope.INT,  # bfd_window and slots: residual_documents re-packs without
        "slots": envelope.INT,  # the options, and a mismatched restore is refused
        "done": envelope.INT,  # sequences of the current window already emitted
        "emitted": envelope.INT,
        "exhausted": envelope.BOOL,
    }

    def __init__(
        self,
        upstream: DocumentNode,
        seq_len: int,
        *,
        bfd_window: int = 1000,
        pad_id: int = 0,
        overlong: str = "split",
        masked: bool = False,
    ):
        self._take(upstream, seq_len, masked)
        self.overlong = OverlongCount(overlong)
        if not 1 <= bfd_window <= MAX_BFD_WINDOW:
            raise ValueError(f"bfd_window must lie in [1, {MAX_BFD_WINDOW}], got {bfd_window}")
        self.bfd_window = bfd_window
        self.pad_id = int(pad_id)
        self._start = 0  # upstream position of the current window's first document
        self._docs: list[np.ndarray] = []
        self._bins: list[list[Ref]] = []
        self._done = 0
        self._emitted = 0
        self._exhausted = False

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        if self._done < len(self._bins):
            start, done = self._start, self._done
        else:  # the window is spent: the next one starts here, nothing to re-read
            start, done = self.upstream.position, 0
        return self._wrap(
            upstream=self.upstream.state_at(start),
            window=self.bfd_window,
            slots=self.window,
            done=done,
            emitted=self._emitted,
            exhausted=self._exhausted,
        )

    @classmethod
    def parse_state(cls, state: object) -> dict:
        state = super().parse_state(state)
        if not 1 <= state["window"] <= MAX_BFD_WINDOW or state["slots"] < 2:
            raise ResumeStateError(
                f"bfd state: window {state['window']} or slots {state['slots']} out of range"
            )
        if state["done"] > state["emitted"]:
            raise ResumeStateError(
                f"bfd state: {state['done']} sequences of the window done, more than the "
                f"{state['emitted']} emitted"
            )
        return state

    # -- what elastic resume needs (shardtok.stream.remainder) ---------------------
    @classmethod
    def residual_documents(
        cls, state: dict, documents: DocumentNode, overlong: str = "split"
    ) -> Iterator[np.ndarray]:
        """The pieces of the window's unemitted sequences (in document order), then every
        later document. `overlong`: the packer's option (the window is re-packed with it)."""
        state = cls.parse_state(state)
        documents.reset(state["upstream"])
        if state["done"]:
            docs = documents._next_many(state["window"])
            lengths = [OverlongCount(overlong).keep(len(d), state["slots"]) for d in docs]
            bins = pack_bfd(lengths, state["slots"])
            if state["done"] > len(bins):
                raise ResumeStateError(_past_window(state["done"], len(bins)))
            for i, start, stop in sorted(r for b in bins[state["done"] :] for r in b):
                yield docs[i][start:stop]
        if not state["exhausted"]:
            yield from documents

    def _reset(self, state: dict | None) -> None:
        self._docs, self._bins, self._done = [], [], 0
        if state is None:
            self.upstream.reset(None)
            self._emitted = 0
            self._exhausted = False
            return
        state = self.parse_state(state)
        if (state["window"], state["slots"]) != (self.bfd_window, self.window):
            raise ResumeStateError(
                f"bfd state was saved with bfd_window {state['window']} and seq_len "
                f"{state['slots'] - 1}; this packer has {self.bfd_window} and {self.window - 1}"
            )
        self.upstream.reset(state["upstream"])
        self._emitted = state["emitted"]
        self._exhausted = state["exhausted"]
        if state["done"]:
            self._read_window(count=False)  # its overlong documents were counted before
            if state["done"] > len(self._bins):
                raise ResumeStateError(_past_window(state["done"], len(self._bins)))
            self._done = state["done"]

    # -- packing ------------------------------------------------------------------------
    def _read_window(self, count: bool = True) -> None:
        self._start = self.upstream.position
        self._docs = self.upstream._next_many(self.bfd_window)  # started by reset
        # A short window is the last: asking an ended upstream again is not part of its contract.
        self._exhausted = len(self._docs) < self.bfd_window
        if self._docs and self.dtype is None:
            self.dtype = self._docs[0].dtype
        counter = self.overlong if count else OverlongCount(self.overlong.mode)
        slots = self.window
        lengths = [n if n <= slots else counter.keep(n, slots) for n in map(len, self._docs)]
        self._bins = pack_bfd(lengths, slots)
        self._done = 0

    def _prepare(self) -> bool:
        while self._done >= len(self._bins):
            if self._exhausted:
                self._docs, self._bins, self._done = [], [], 0
                return False
            self._read_window()
        return True

    def _emit_into(self, out: np.ndarray) -> tuple[list[int], int]:
        refs = self._bins[self._done]
        self._done += 1
        self._emitted += 1
        starts = []
        at = 0
        for i, start, stop in refs:
            starts.append(at)
            out[at : at + stop - start] = self._docs[i][start:stop]
            at += stop - start
        out[at:] = self.pad_id
        return starts, at


def _past_window(done: int, count: int) -> str:
    return f"bfd state: {done} sequences of the window done, but it packs into {count}"
