"""Reads the documents of one slice of the epoch plan, several shards at a time.

The slice's pieces are taken in plan order in groups of ``interleave``; the pieces of a group
are open together and their documents are taken round-robin (a piece that runs out drops out
of the rotation), so the shuffle buffer downstream sees several shards at once. Each open
piece costs one decoded frame of memory.

A piece is a token range of a shard; the documents it cuts at either end are trimmed to the
range (the other part belongs to the neighbouring slice).

State: ``{"group", "ordinal", "position"}``: the group, how many documents of the group were
emitted (the round-robin rule turns that back into a cursor per piece), and the position in
the slice. Only the shard heads (json and idx) of one group are read to restore.

With ``masked`` (a dataset with loss masks) mask frame n is read beside token frame n and put
into the tokens as their sign, once per frame (``shardtok.stream.masked``): documents are int32
arrays whose untrained tokens are negative, and trimming one trims its mask with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError, ResumeStateError
from shardtok.format.decode_ahead import DecodeAhead
from shardtok.format.shard_reader import AHEAD_FRAMES, ShardStreamReader
from shardtok.stream import state as envelope
from shardtok.stream.masked import flag_frame
from shardtok.stream.nodes.base import DocumentNode
from shardtok.stream.plan import Piece

# Frames a slice reader's open shards decode ahead of the ones cut, in all (each at least
# AHEAD_FRAMES): the memory bound of the four open shards of the default interleave.
AHEAD_BUDGET = 8


def round_robin_consumed(counts: Sequence[int], ordinal: int) -> tuple[list[int], int]:
    """Documents taken from each piece after `ordinal` round-robin steps over `counts`, and the
    piece the rotation continues with (pieces before it already had their turn this round)."""
    n = np.asarray(counts, dtype=np.int64)
    lo, hi = 0, int(n.max(initial=0))
    while lo < hi:  # largest full-round count J with sum(min(n, J)) <= ordinal
        mid = (lo + hi + 1) // 2
        if int(np.minimum(n, mid).sum()) <= ordinal:
            lo = mid
        else:
            hi = mid - 1
    taken = np.minimum(n, lo)
    extra = ordinal - int(taken.sum())
    resume = 0
    for i in range(len(n)):
        if extra == 0:
            break
        if n[i] > lo:
            taken[i] += 1
            extra -= 1
            resume = i + 1
    if extra:
        raise ValueError(
            f"ordinal {ordinal} is past the end of pieces with {list(counts)} documents"
        )
    return [int(t) for t in taken], resume


class _OpenPiece:
    """One piece of a shard, open for sequential reading."""

    def __init__(
        self,
        source: DatasetSource,
        piece: Piece,
        expected_tokens: int,
        masked: bool = False,
        ahead: DecodeAhead | None = None,
        ahead_frames: int = AHEAD_FRAMES,
    ):
        self.piece = piece
        self.masked = masked
        # open_stream checked the shard against its manifest entry (counts included).
        self.reader, self._file = source.open_stream(piece.file, with_masks=masked)
        # Only a shard's own reader decodes frames (a provenance trace's stands-in does not).
        self.ahead = ahead if isinstance(self.reader, ShardStreamReader) else None
        self.ahead_frames = ahead_frames
        offsets = self.reader.offsets
        if not 0 <= piece.start < piece.stop <= expected_tokens:
            raise ValueError(f"piece {piece} outside the shard's {expected_tokens} tokens")
        self.first = int(np.searchsorted(offsets, piece.start, side="right")) - 1
        self.stop = int(np.searchsorted(offsets, piece.stop, side="left"))
        self.head_trim = piece.start - int(offsets[self.first])
        self.tail_keep = piece.stop - int(offsets[self.stop - 1])
        self.count = self.stop - self.first

    def start(self, skip: int) -> None:
        """Read the piece's documents from the `skip`-th on (``take``)."""
        more = (
            {} if self.ahead is None else {"ahead": self.ahead, "ahead_frames": self.ahead_frames}
        )
        first = self.first + skip
        if isinstance(self.reader, ShardStreamReader):
            self._runs = self.reader.document_runs(
                first, self.stop, with_masks=self.masked,
                combine=flag_frame if self.masked else None, **more,
            )  # fmt: skip
        else:  # a reader without runs (a provenance trace's stand-in): runs of its documents
            docs = self.reader.documents(first, self.stop, with_masks=self.masked)
            self._runs = iter(lambda: list(islice(docs, 256)), [])
        self._run: list = []
        self._at = 0
        self._next_doc = first

    def take(self, count: int) -> list[np.ndarray]:
        """The next `count` documents (there are that many), trimmed to the piece's token
        range; the piece closes after its last one."""
        out: list = []
        run, at = self._run, self._at
        while len(out) < count:
            if at == len(run):
                # A StopIteration here would end the whole slice quietly, one piece short.
                run, at = next(self._runs, None), 0
                if run is None:
                    got = self._next_doc + len(out)
                    raise CorruptShardError(
                        self.reader.where, None, None,
                        f"documents end at {got:,}, the piece reads to {self.stop:,}",
                    )  # fmt: skip
            took = run[at : at + count - len(out)]
            at += len(took)
            out += took
        self._run, self._at = run, at
        number, self._next_doc = self._next_doc, self._next_doc + count
        if number == self.first and self.head_trim:
            end = self.tail_keep if self.first == self.stop - 1 else None
            out[0] = out[0][self.head_trim : end]
        if self._next_doc == self.stop:
            if number + count - 1 != self.first or not self.head_trim:
                out[-1] = out[-1][: self.tail_keep]
            self.close()
        return out

    def close(self) -> None:
        runs = getattr(self, "_runs", None)
        if runs is not None:
            self._runs = None
            if hasattr(runs, "close"):
                runs.close()  # the reader's generator: settles any frame read ahead
        if self._file is not None:
            self._file.close()
            self._file = None
            if self.reader.mask_source is not None:  # the range reads of the mask frames
                self.reader.mask_source.close()


class SliceReader(DocumentNode):
    KIND = "reader"
    FIELDS = {"group": envelope.INT, "ordinal": envelope.INT, "position": envelope.INT}

    def __init__(
        self,
        source: DatasetSource,
        pieces: Sequence[Piece],
        interleave: int = 4,
        masked: bool = False,
        decode_ahead: bool = True,
    ):
        super().__init__()
        if interleave < 1:
            raise ValueError(f"interleave must be at least 1, got {interleave}")
        self.source = source
        self.masked = masked
        self.pieces = tuple(pieces)
        self.interleave = interleave
        self.position = 0
        self._group = 0
        self._ordinal = 0
        self._bases: dict[int, int] = {}  # group -> slice position of its first document
        self._counts: dict[int, int] = {}  # group -> documents in it
        self._docs: bool | None = None  # whether a group is open
        self._open: list[_OpenPiece] = []
        # Frames are decoded ahead (AHEAD_BUDGET shared by the open shards) in a helper thread,
        # started on first use, ended with the slice, on close() or when this reader is collected.
        self._ahead = DecodeAhead() if decode_ahead else None

    @property
    def num_groups(self) -> int:
        return -(-len(self.pieces) // self.interleave)

    def _close(self) -> None:
        for p in self._open:
            p.close()
        self._open = []
        self._docs = None
        self._ready = []
        self._ready_at = 0

    def close(self) -> None:
        """Close the open shards and end the helper thread (``reset`` opens them again)."""
        self._close()
        if self._ahead is not None:
            self._ahead.close()

    def _open_group(self, group: int, ordinal: int) -> None:
        self._close()
        self._group, self._ordinal = group, ordinal
        if group >= self.num_groups:
            if self._ahead is not None:  # the slice is read: nothing more to decode
                self._ahead.close()
            return
        manifest = self.source.manifest
        members = self.pieces[group * self.interleave : (group + 1) * self.interleave]
        # The frames decoded ahead are shared out: one open shard gets them all (8 ahead: a
        # one-shard slice's window ran 20% faster than with 2), four get 2 each, as before.
        ahead_frames = max(AHEAD_FRAMES, AHEAD_BUDGET // len(members))
        self._open = [
            _OpenPiece(
                self.source,
                p,
                manifest.shards[p.shard].num_tokens,
                self.masked,
                self._ahead,
                ahead_frames,
            )
            for p in members
        ]
        # Remote shards: the next group's first blocks arrive while this group is consumed.
        following = self.pieces[(group + 1) * self.interleave : (group + 2) * self.interleave]
        self.source.prefetch([p.file for p in following])
        counts = [p.count for p in self._open]
        self._counts[group] = sum(counts)
        self._bases[group] = self.position - ordinal
        taken, resume = round_robin_consumed(counts, ordinal)
        for p, t in zip(self._open, taken):
            if t < p.count:
                p.start(t)
            else:
                p.close()
        self._remaining = [c - t for c, t in zip(counts, taken)]
        # The interrupted round first: the pieces from `resume` on still have their turn.
        self._first_round = [i for i in range(resume, len(counts)) if self._remaining[i] > 0]
        self._active: list[int] | None = None  # after the first round
        self._ready: list[np.ndarray] = []  # documents in round-robin order, not yet emitted
        self._ready_at = 0
        self._docs = True  # a group is open

    def _take(self, count: int) -> list[np.ndarray]:
        """The group's next `count` documents in round-robin order, fewer at its end.

        Whole rounds are taken at once: `m` documents from every piece still in the rotation
        (as many rounds as the request needs, at most until the first piece runs out), then
        interleaved; a round cut short by the request stays ready for the next call."""
        ready, at = self._ready, self._ready_at
        remaining, pieces = self._remaining, self._open
        while len(ready) - at < count:
            if self._active is None:
                for i in self._first_round:
                    ready += pieces[i].take(1)
                    remaining[i] -= 1
                self._active = [i for i, r in enumerate(remaining) if r > 0]
                continue
            active = self._active
            if not active:
                break
            need = count - (len(ready) - at)
            rounds = min(-(-need // len(active)), min(remaining[i] for i in active))
            if len(active) == 1:
                ready += pieces[active[0]].take(rounds)
            else:
                taken = [pieces[i].take(rounds) for i in active]
                ready += [doc for docs in zip(*taken) for doc in docs]
            for i in active:
                remaining[i] -= rounds
            self._active = [i for i in active if remaining[i] > 0]
        out = ready[at : at + count]
        at += len(out)
        # Drop what was emitted soon: a document kept here keeps its whole frame in memory.
        if at == len(ready):
            ready.clear()
            at = 0
        elif at > 256:
            del ready[:at]
            at = 0
        self._ready_at = at
        return out

    def _reset(self, state: dict | None) -> None:
        self._bases, self._counts = {}, {}
        if state is None:
            self.position = 0
            self._open_group(0, 0)
        else:
            state = self.parse_state(state)
            group = envelope.check_range(self.KIND, "group", state["group"], 0, self.num_groups)
            self.position = state["position"]
            try:
                self._open_group(group, state["ordinal"])
            except ValueError as exc:  # an ordinal past the group's documents: an edited state
                raise ResumeStateError(f"reader state: field 'ordinal': {exc}") from None

    def _next(self) -> np.ndarray:
        docs = self._next_many(1)
        if not docs:
            raise StopIteration
        return docs[0]

    def _next_many(self, count: int) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        while len(out) < count and self._docs is not None:
            got = self._take(count - len(out))
            out += got
            self.position += len(got)
            self._ordinal += len(got)
            if len(out) < count:  # this group ran out
                self._open_group(self._group + 1, 0)
        return out

    def state_at(self, position: int) -> dict:
        if not self._started:
            self.reset(None)
        for group in sorted(self._bases, reverse=True):
            base = self._bases[group]
            if base <= position:
                if position - base == self._counts[group]:  # the group's end: the next one
                    return self._wrap(group=group + 1, ordinal=0, position=position)
                return self._wrap(group=group, ordinal=position - base, position=position)
        if position == self.position:  # past every group: the end of the slice
            return self._wrap(group=self._group, ordinal=self._ordinal, position=position)
        raise ValueError(f"slice reader cannot describe position {position}")
