"""Groups packed sequences into batches and stops after exactly the planned number of batches."""

from __future__ import annotations

import numpy as np

from shardtok.errors import ShardtokError
from shardtok.stream import state as envelope
from shardtok.stream.batch import (
    Allocator,
    allocate_arrays,
    assemble_batch,
    assemble_contiguous_batch,
)
from shardtok.stream.nodes.base import Node
from shardtok.stream.nodes.bfd import BFDPacker
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.packer import Packer


def _row_dtype(packer: Packer) -> np.dtype:
    """The staging rows' dtype: int32 for flagged tokens (masked data: half the bytes to write
    and to turn into inputs and labels) where every value a row gets fits it -- token ids do,
    the padding id of one dataset's packer is checked, a mix keeps int64 -- else int64."""
    one_dataset = isinstance(packer, (ConcatPacker, GreedyPacker, BFDPacker))
    if one_dataset and packer.masked and getattr(packer, "pad_id", 0) <= np.iinfo(np.int32).max:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


class Batcher(Node[dict]):
    """Yields batches of `batch_size` sequences; `num_batches` (when given) is exact.

    Each batch's ``source_ids`` names every row's source (``Packer.row_source``); the
    contiguous path (one dataset, concat) has only source 0.

    The plan guarantees every slice can fill `num_batches`; if the upstream runs dry earlier the
    data disagrees with its manifest, and that is an error rather than a silent short epoch
    (which would hang a distributed job). The state is the packer's state at a batch boundary
    plus counters.

    `planned_rows` (an epoch's or a remainder's sequences per slice) sets `num_batches` from the
    rows: ``planned_rows // batch_size`` from the start, and from a state ``batches + (rows
    left) // batch_size``, so a state saved with another batch size continues the same rows in
    batches of this one (``sequences`` counts the rows, whatever their batches' sizes).
    """

    KIND = "batcher"
    FIELDS = {
        "upstream": envelope.STATE,
        "batches": envelope.INT,
        "real_tokens": envelope.INT,
        "sequences": envelope.INT,
        "segments": envelope.INT,
    }

    def __init__(
        self,
        upstream: Packer,
        batch_size: int,
        *,
        num_batches: int | None = None,
        mask_boundary_labels: bool = False,
        labels_format: str = "shifted",
        allocate: Allocator = allocate_arrays,
        where: str = "stream",
        planned_rows: int | None = None,
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.upstream = upstream
        self.batch_size = batch_size
        self.planned_rows = planned_rows
        if planned_rows is not None:
            num_batches = planned_rows // batch_size
        self.num_batches = num_batches
        self.mask_boundary_labels = mask_boundary_labels
        self.labels_format = labels_format
        self.allocate = allocate
        self.where = where
        self._rows: np.ndarray | None = None
        self._sources = np.empty(0, dtype=np.int64)
        self.batches = 0
        self.real_tokens = 0  # tokens that are not padding (sequence slots: seq_len + 1 each)
        self.sequences = 0
        self.segments = 0

    def _reset(self, state: dict | None) -> None:
        if state is None:
            self.upstream.reset(None)
            self.batches = self.real_tokens = self.sequences = self.segments = 0
            if self.planned_rows is not None:
                self.num_batches = self.planned_rows // self.batch_size
        else:
            state = self.parse_state(state)
            if self.planned_rows is not None:
                rows = envelope.check_range(
                    self.KIND, "sequences", state["sequences"], 0, self.planned_rows
                )
                left = (self.planned_rows - rows) // self.batch_size
                self.num_batches = state["batches"] + left
            limit = float("inf") if self.num_batches is None else self.num_batches
            envelope.check_range(self.KIND, "batches", state["batches"], 0, limit)
            self.upstream.reset(state["upstream"])
            self.batches = state["batches"]
            self.real_tokens = state["real_tokens"]
            self.sequences = state["sequences"]
            self.segments = state["segments"]

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        return self._wrap(
            upstream=self.upstream.state_dict(),
            batches=self.batches,
            real_tokens=self.real_tokens,
            sequences=self.sequences,
            segments=self.segments,
        )

    @classmethod
    def progress(cls, state: dict) -> tuple[dict, int]:
        """The packer's state inside a batcher `state`, and the real tokens yielded by then
        (what elastic resume needs)."""
        state = cls.parse_state(state)
        return state["upstream"], state["real_tokens"]

    def _next(self) -> dict:
        if self.num_batches is not None and self.batches >= self.num_batches:
            raise StopIteration
        upstream = self.upstream
        if getattr(upstream, "contiguous", False):
            cut = upstream.next_batch(self.batch_size)
            if cut is not None:
                pieces, boundaries = cut
                return self._count(
                    assemble_contiguous_batch(
                        pieces,
                        boundaries,
                        self.batch_size,
                        mask_boundary_labels=self.mask_boundary_labels,
                        labels_format=self.labels_format,
                        allocate=self.allocate,
                        masked=upstream.masked,
                    ),
                    self.batch_size * upstream.window,
                )
            # Not enough data for a whole batch: the row path below reports exactly where.
        # One reused staging array: the packer writes each sequence straight into its row.
        if self._rows is None:
            self._rows = np.empty((self.batch_size, upstream.window), dtype=_row_dtype(upstream))
            self._sources = np.empty(self.batch_size, dtype=np.int64)
        rows = self._rows
        starts, lengths = [], []
        masked = upstream.masked
        sft_rows = []  # masked data: which rows are (a mix holds both kinds)
        sources = self._sources  # staging too: assembling copies them into the batch
        for b in range(self.batch_size):
            try:
                row_starts, length = upstream.next_into(rows[b])
            except StopIteration:
                if self.num_batches is None:  # an open-ended stream drops its partial batch
                    raise
                raise ShardtokError(
                    f"{self.where}: ran out of data after {self.batches} full batches and "
                    f"{b} sequences, but the epoch plan promised {self.num_batches} "
                    "batches (do the shards hold the token counts the manifest says?)"
                ) from None
            starts.append(row_starts)
            lengths.append(length)
            sources[b] = upstream.row_source
            if masked:
                sft_rows.append(upstream.row_masked)
        batch = assemble_batch(
            rows,
            starts,
            lengths,
            mask_boundary_labels=self.mask_boundary_labels,
            labels_format=self.labels_format,
            allocate=self.allocate,
            masked=masked,
            sft_rows=sft_rows if masked else None,
            source_ids=sources,
        )
        return self._count(batch, sum(lengths))

    def _count(self, batch: dict, real_tokens: int) -> dict:
        self.batches += 1
        self.sequences += self.batch_size
        self.real_tokens += real_tokens
        self.segments += len(batch["cu_seqlens"]) - 1
        return batch

    def stats(self) -> dict:
        """Packing statistics so far; slots count ``seq_len + 1`` tokens per sequence."""
        window = int(self.upstream.window)
        slots = self.sequences * window
        out = {
            "batches": self.batches,
            "sequences": self.sequences,
            "real_tokens": self.real_tokens,
            "slots": slots,
            "packing_efficiency": self.real_tokens / slots if slots else 0.0,
            "segments": self.segments,
        }
        counted = getattr(self.upstream, "overlong", None)  # greedy, bfd (this process)
        if counted is not None:
            out.update(counted.stats())
        return out
