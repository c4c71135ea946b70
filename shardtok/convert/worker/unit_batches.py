"""A unit's documents on their way to its files, inside a worker: text batches for the
encoder, fine-tuning records rendered, encoded and masked in batches, and each document's (piece,
record) row. unit_tokenizer.py drives them for one unit; each batch's writes go to the
worker's writer thread (background.py).
"""

from __future__ import annotations

import bisect
import functools
import itertools

import numpy as np

from shardtok.convert.inputs.records import Reject
from shardtok.convert.sft.conversation import SFTBad
from shardtok.convert.sft.setup import SFTSetup
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.tokenizing.tokenizer import TokenizerSpec
from shardtok.convert.worker.background import BackgroundWriter
from shardtok.format.frames import FrameBuilder, FrameEncoder

_BATCH_CHARS = 1 << 20
_BATCH_DOCS = 4096


class TextBatcher:
    """Texts to token batches; each batch's writes (tokens file, frames) go to `sink`."""

    def __init__(self, encoder: BatchEncoder, out, frames: FrameBuilder, sink: BackgroundWriter):
        self.encoder = encoder
        self.out = out
        self.frames = frames
        self.sink = sink
        self.texts: list[str] = []
        self.chars = 0
        self.sizes: list[np.ndarray] = []
        self.num_tokens = 0

    def add(self, text: str) -> None:
        self.texts.append(text)
        self.chars += len(text)
        if self.chars >= _BATCH_CHARS or len(self.texts) >= _BATCH_DOCS:
            self.flush()

    def extend(self, texts: list[str]) -> None:
        """add() for each of `texts`, cut into the same batches, without a call per text."""
        ends = list(itertools.accumulate(map(len, texts)))
        at = 0
        while at < len(texts):
            before = ends[at - 1] if at else 0
            # The text that brings the batch to _BATCH_CHARS closes it, as in add().
            full = bisect.bisect_left(ends, _BATCH_CHARS - self.chars + before, at) + 1
            stop = min(full, at + _BATCH_DOCS - len(self.texts), len(texts))
            self.texts.extend(texts[at:stop])
            self.chars += ends[stop - 1] - before
            at = stop
            if self.chars >= _BATCH_CHARS or len(self.texts) >= _BATCH_DOCS:
                self.flush()

    def flush(self) -> None:
        if not self.texts:
            return
        tokens, sizes = self.encoder.encode(self.texts)
        self.sink.submit(functools.partial(store, self.out, self.frames, tokens, sizes))
        self.sizes.append(sizes)
        self.num_tokens += tokens.size
        self.texts, self.chars = [], 0


@functools.cache
def frame_encoder(level: int | None) -> FrameEncoder:
    # One per process and level: every unit's frames are compressed on the process's one
    # writer thread (worker._sink), one at a time.
    return FrameEncoder(level)


def store(out, frames: FrameBuilder, tokens: np.ndarray, sizes: np.ndarray) -> None:
    out.write(tokens.data)
    frames.add(tokens, sizes)


class SFTRecords:
    """A worker's SFT pipeline (built once per worker: the jq patterns compile here) and the
    current unit's counts and pending records.

    Records go through in batches: :meth:`add` converts and renders each one as it is read,
    and once the batch's rendered text reaches _BATCH_CHARS (or _BATCH_DOCS records) the texts
    are encoded in one tiktoken call and each record masked, in order (:meth:`flush`). Why:
    encoding one record at a time between renders cost ~35% more per record than encoding the
    same texts back to back. A bad record stays in its place in the batch; under
    ``--on-bad-record error`` (`stop`) the batch is finished as soon as one is known, and
    nothing after the first bad one is handed back, so the record reported is the one the
    record-by-record pipeline reported."""

    def __init__(self, setup: SFTSetup, spec: TokenizerSpec):
        from shardtok.convert.sft.encode import SFTEncoder
        from shardtok.convert.sft.formats import make_converter

        config = setup.config
        self.fields = config.record_fields()
        self.convert = make_converter(config)
        self.renderer = setup.renderer
        self.encoder = SFTEncoder(
            spec,
            max_tokens=config.max_tokens,
            truncation=config.truncation,
            split_special_tokens=config.split_special_tokens,
        )
        self.start_unit()

    def start_unit(self) -> None:
        self.boundary = self.truncated = 0
        # (piece, record, conversation or None, (rendered, split) or the bad record)
        self.pending: list[tuple] = []
        self.chars = 0
        # The jq rewrites a unit used travel in its result, so the note is the same whichever
        # worker (or earlier run) did the unit.
        if hasattr(self.convert, "rewrites"):
            self.convert.rewrites.clear()

    def encode(self, record):
        """EncodedRecord (ids, mask, boundary_tokens, truncated) or SFTBad: one record alone."""
        conversation = self.convert(record)
        if isinstance(conversation, SFTBad):
            return conversation
        return self._counted(self.encoder.encode(conversation, self.renderer))

    def _counted(self, encoded):
        if not isinstance(encoded, SFTBad):
            self.boundary += int(encoded.boundary_tokens)
            self.truncated += bool(encoded.truncated)
        return encoded

    def add(self, piece: int, record: int, item, stop: bool) -> list[tuple]:
        """Take one record read (a dict, or the reader's Reject); hand back the records
        finished by now, in order, as (piece, record, EncodedRecord | SFTBad | Reject, rendered
        text or None). `stop`: --on-bad-record error (see the class docstring)."""
        conversation = None
        value = item
        if not isinstance(item, Reject):
            value = conversation = self.convert(item)
            if not isinstance(conversation, SFTBad):
                value = self.encoder.prepare(conversation, self.renderer)
        self.pending.append((piece, record, conversation, value))
        if isinstance(value, tuple):
            self.chars += len(value[0].text)
            if self.chars < _BATCH_CHARS and len(self.pending) < _BATCH_DOCS:
                return []
        elif not stop and len(self.pending) < _BATCH_DOCS:
            return []
        return self.flush(stop)

    def flush(self, stop: bool) -> list[tuple]:
        """The pending records finished, as :meth:`add` hands them back."""
        pending, self.pending, self.chars = self.pending, [], 0
        texts = [v[0].text for *_, v in pending if isinstance(v, tuple) and not v[1]]
        ids = iter(self.encoder.batch_ids(texts))
        done = []
        for piece, record, conversation, value in pending:
            text = None
            if isinstance(value, tuple):
                rendered, split = value
                text = rendered.text
                value = self._counted(
                    self.encoder.finish(
                        conversation, self.renderer, rendered, split, None if split else next(ids)
                    )
                )
            done.append((piece, record, value, text))
            if stop and isinstance(value, (SFTBad, Reject)):
                break
        return done

    def unit_stats(self, trained: int) -> dict:
        rewrites = getattr(self.convert, "rewrites", [])
        return {
            "trained_tokens": trained,
            "boundary_tokens": self.boundary,
            "truncated_records": self.truncated,
            "jq_rewrites": [list(r) for r in rewrites],
        }


class SFTBatcher:
    """Encoded records to the unit's token, mask and frame files, in batches."""

    def __init__(self, dtype, out, mask_out, frames: FrameBuilder, sink: BackgroundWriter):
        self.dtype = dtype
        self.out = out
        self.mask_out = mask_out
        self.frames = frames
        self.sink = sink
        self.ids: list = []
        self.masks: list = []
        self.pending = 0
        self.sizes: list[np.ndarray] = []
        self.num_tokens = 0
        self.trained = 0

    def add(self, ids, mask) -> None:
        self.ids.append(np.asarray(ids, dtype=self.dtype))
        self.masks.append(np.asarray(mask, dtype=np.uint8))
        self.pending += len(self.ids[-1])
        if self.pending >= _BATCH_CHARS // 4 or len(self.ids) >= _BATCH_DOCS:
            self.flush()

    def flush(self) -> None:
        if not self.ids:
            return
        tokens, mask = np.concatenate(self.ids), np.concatenate(self.masks)
        sizes = np.fromiter(map(len, self.ids), dtype=np.int32, count=len(self.ids))
        self.sink.submit(functools.partial(self.mask_out.write, mask.data))
        self.sink.submit(functools.partial(store, self.out, self.frames, tokens, sizes))
        self.sizes.append(sizes)
        self.num_tokens += tokens.size
        self.trained += int(np.count_nonzero(mask))
        self.ids, self.masks, self.pending = [], [], 0


class DocRows:
    """The (piece, record) of each of a unit's documents, kept as runs of consecutive records
    (a TextRun is one, and a single record extends the run it follows), and written out as
    columns at the unit's end: a tuple per document and numpy's conversion of the list cost
    ~1% of a worker's tokenizing thread."""

    def __init__(self) -> None:
        self._runs: list[list[int]] = []  # [piece, first record, last record + 1]
        self.count = 0

    def add_run(self, piece: int, records: range) -> None:
        """`records`: consecutive record numbers (step 1)."""
        if records:
            self._extend(piece, records.start, records.stop)

    def add(self, piece: int, record: int) -> None:
        self._extend(piece, record, record + 1)

    def _extend(self, piece: int, start: int, stop: int) -> None:
        self.count += stop - start
        if self._runs:
            last = self._runs[-1]
            if last[0] == piece and last[2] == start:
                last[2] = stop
                return
        self._runs.append([piece, start, stop])

    def fill(self, docs: np.ndarray) -> None:
        """Columns 0 (piece) and 1 (record) of `docs`, one row per document."""
        if not self._runs:
            return
        runs = np.asarray(self._runs, dtype=np.int64)
        lengths = runs[:, 2] - runs[:, 1]
        docs[:, 0] = np.repeat(runs[:, 0], lengths)
        # Row j of run i (rows first_i...): record start_i + (j - first_i).
        firsts = np.cumsum(lengths) - lengths
        docs[:, 1] = np.arange(self.count) + np.repeat(runs[:, 1] - firsts, lengths)
