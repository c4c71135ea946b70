"""Elastic resume: finish an epoch with another world size or number of workers.

The rule. At save time every old (rank, worker) slice has read a prefix of its own document
stream (reader, then shuffle buffer) and its packer holds a few documents or pieces. What remains
of the epoch is, per old slice in slice order, its *residual stream*: the tokens it had not put
into a yielded sequence (concat: from the next window's first token on; greedy: the pieces in
open and finished-but-unyielded sequences, then every later document), through the end of the
slice, including the tail the old plan would have left unread. The residual streams are joined
in old-slice order (R tokens) and cut into the new ``world_size * num_workers`` slices at token
offsets ``j * R // S'``, exactly as an epoch is cut (a document cut there becomes two). Every new
slice then packs and batches as usual, and every new slice yields the same number of batches
``min_j(sequences_j) // batch_size``; the leftover is reported (``ElasticPlan.tokens_unread``).

No document is repeated or skipped: a token is either in a sequence yielded before the save or
in exactly one residual stream. Computing this needs the states of ALL old slices (gather them
on rank 0 or read every rank's checkpoint file) merged with :func:`merge_states`. It is refused
(ResumeStateError) when a slice is missing or given twice, when states come from different
epochs or fingerprints, for a remainder merged again, and when the remainder is too small to
give every new slice one batch. Weighted mixes apply the rule per source (``mix/remainder.py``).

A new slice re-reads its residual documents from the start of its first old slice's saved
position, so its own state is just a document count (re-read on resume: the cost is at most one
slice of reading).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError, ShardtokError, UsageError
from shardtok.index.slices import cut_ranges
from shardtok.stream import state as envelope
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.build import (
    batcher_for,
    document_stream,
    packer_class,
    packer_for,
    plan_for,
    resolved,
)
from shardtok.stream.nodes.base import DocumentNode, PlacedStream
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan, sequence_count


def slice_progress(packer: dict | None, real_tokens: int) -> dict:
    """What elastic resume keeps of one old slice: its packer's state (None: not started) and
    the real tokens it had yielded."""
    return {"packer": packer, "real_tokens": real_tokens}


def check_progress(progress: object, where: str) -> dict:
    if (
        not isinstance(progress, dict)
        or set(progress) != {"packer", "real_tokens"}
        or not (progress["packer"] is None or isinstance(progress["packer"], dict))
        or not isinstance(progress["real_tokens"], int)
        or progress["real_tokens"] < 0
    ):
        raise ResumeStateError(
            f"{where}: each old slice must be {{'packer': state or null, 'real_tokens': n >= 0}}"
        )
    return progress


# What a merged layout keeps of the options its states were saved with (``was``): how the old
# slices were packed and batched, which a resume may change (docs/RESUME.md).
SAVED_OPTIONS = ("seq_len", "stride", "batch_size")


def saved_options(options: StreamOptions, layout: dict) -> StreamOptions:
    """`options` as the old layout streamed them (a layout merged before 0.4 has no ``was``:
    its states were saved with these)."""
    return replace(options, **layout.get("was", {}))


def check_layout(elastic: object, where: str, per_slice=check_progress) -> dict:
    """An old layout's saved positions: ``{"world_size", "num_workers", <slices or sources>}``
    and, merged from 0.4 on, ``was`` (``SAVED_OPTIONS``)."""
    if not isinstance(elastic, dict):
        raise ResumeStateError(f"{where}: the old layout must be an object")
    was = elastic.get("was", {})
    if not isinstance(was, dict) or set(was) - set(SAVED_OPTIONS):
        raise ResumeStateError(f"{where}: field 'was' may hold only {', '.join(SAVED_OPTIONS)}")
    try:
        StreamOptions(**{"seq_len": 1, "batch_size": 1, **was})
    except (UsageError, TypeError) as exc:
        raise ResumeStateError(f"{where}: field 'was': {exc}") from None
    for key in ("world_size", "num_workers"):
        value = elastic.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ResumeStateError(f"{where}: field {key!r} must be a positive integer")
    count = elastic["world_size"] * elastic["num_workers"]
    slices = elastic.get("slices")
    if not isinstance(slices, list) or len(slices) != count:
        raise ResumeStateError(
            f"{where}: field 'slices' must list all {count} old slices (world_size x num_workers)"
        )
    for entry in slices:
        per_slice(entry, where)
    return elastic


def residual_tokens(plan: EpochPlan, index: int, progress: dict) -> int:
    """Tokens of old slice `index` not in any sequence it yielded (see ``slice_progress``)."""
    total = plan.slices[index].num_tokens
    if progress["packer"] is None:
        return total
    packer = packer_class(plan.packing)
    return packer.residual_tokens(progress["packer"], total, plan.stride, progress["real_tokens"])


def residual_documents(
    source: DatasetSource, options: StreamOptions, plan: EpochPlan, index: int, progress: dict
) -> Iterator[np.ndarray]:
    """The residual stream of old slice `index` (module docstring), document by document."""
    documents = document_stream(source, plan.slices[index], options, plan.epoch)
    if progress["packer"] is None:
        documents.reset(None)
        return iter(documents)
    overlong = options.overlong_for(source.manifest.masked)
    return packer_class(plan.packing).residual_documents(progress["packer"], documents, overlong)


@dataclass(frozen=True)
class ElasticPlan:
    """The new slices of an epoch's remainder: (old slice, residual token range) segments."""

    residuals: tuple[int, ...]  # tokens per old slice
    segments: tuple[tuple[tuple[int, int, int], ...], ...]  # per new slice
    sequences: tuple[int, ...]
    batches_per_slice: int
    tokens_unread: int


def elastic_plan(
    old: EpochPlan, slices: list[dict], new_slices: int, options: StreamOptions
) -> ElasticPlan:
    """The new slices of `old`'s remainder (`old` planned with the options its states were
    saved with), packed and batched with `options`."""
    residuals = [residual_tokens(old, i, s) for i, s in enumerate(slices)]
    total = sum(residuals)
    segments = [parts for _, _, parts in cut_ranges(residuals, new_slices)]
    window = options.seq_len + 1
    stride = options.stride or window
    sequences = []
    for j in range(new_slices):
        a, b = j * total // new_slices, (j + 1) * total // new_slices
        sequences.append(sequence_count(b - a, old.packing, options.seq_len, stride))
    batches = min(sequences) // options.batch_size
    read = 0
    for j in range(new_slices):
        n = batches * options.batch_size
        size = (j + 1) * total // new_slices - j * total // new_slices
        if n:
            read += (n - 1) * stride + window if old.packing == "concat" else min(size, n * window)
    return ElasticPlan(tuple(residuals), tuple(segments), tuple(sequences), batches, total - read)


class RemainderDocuments(DocumentNode):
    """The documents of one new slice: its residual token ranges, in order.

    State: documents emitted (restoring re-reads from the slice's start).
    """

    KIND = "remainder_documents"
    FIELDS = {"position": envelope.INT}

    def __init__(self, make_residual, segments: tuple[tuple[int, int, int], ...]):
        super().__init__()
        self.make_residual = make_residual
        self.segments = segments
        self.position = 0
        self._docs: Iterator[np.ndarray] = iter(())

    def _generate(self) -> Iterator[np.ndarray]:
        for index, lo, hi in self.segments:
            at = 0
            for doc in self.make_residual(index):
                end = at + len(doc)
                if end > lo and len(doc):
                    yield doc[max(lo - at, 0) : min(hi, end) - at]
                at = end
                if at >= hi:
                    break

    def _reset(self, state: dict | None) -> None:
        self._docs = self._generate()
        self.position = 0
        target = 0 if state is None else self.parse_state(state)["position"]
        for _ in range(target):
            if next(self._docs, None) is None:
                raise ResumeStateError(
                    f"remainder_documents state: field 'position' is {target}, past the end of "
                    "this slice"
                )
            self.position += 1

    def _next(self) -> np.ndarray:
        doc = next(self._docs)
        self.position += 1
        return doc

    def state_at(self, position: int) -> dict:
        return self._wrap(position=position)


class ElasticStream(PlacedStream):
    """One new (rank, worker)'s batches for the remainder of an epoch saved with another layout."""

    KIND = "elastic_stream"
    FIELDS = {**PlacedStream.PLACEMENT, "elastic": envelope.OBJECT, "remainder": envelope.STATE}
    state_name = "remainder"
    resume_hint = "an elastically resumed epoch resumes again with the same world size and workers"
    batcher_key = "remainder"

    def __init__(
        self,
        source: DatasetSource,
        options: StreamOptions,
        elastic: dict,
        *,
        epoch: int,
        rank: int,
        world_size: int,
        worker: int,
        num_workers: int,
        allocate: Allocator = allocate_arrays,
    ):
        super().__init__()
        elastic = check_layout(elastic, "elastic resume state")
        options = resolved(options, [source])
        if options.packing != "concat" and options.overlong != "split":
            # The remainder is planned from token counts alone; truncated or dropped
            # documents would make a new slice promise batches it cannot fill.
            raise ResumeStateError(
                f"{source.display}: elastic resume (another world size or number of workers) "
                f"needs overlong='split' with {options.packing} packing, this stream has "
                f"{options.overlong!r}; finish epoch {epoch} with the old layout, or start the "
                "next epoch"
            )
        self.source, self.options, self.elastic = source, options, elastic
        self.epoch = epoch
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.old_plan = plan_for(
            source,
            saved_options(options, elastic),
            epoch=epoch,
            world_size=int(elastic["world_size"]),
            num_workers=int(elastic["num_workers"]),
        )
        self.plan = elastic_plan(
            self.old_plan, elastic["slices"], world_size * num_workers, options
        )
        if self.plan.batches_per_slice == 0:
            raise ShardtokError(
                f"{source.display}: the rest of epoch {epoch} ({sum(self.plan.residuals):,} "
                f"tokens) cannot give each of {world_size * num_workers} new slices a batch; "
                "finish this epoch with the old world size and workers, or start the next epoch"
            )
        index = rank * num_workers + worker
        documents = RemainderDocuments(self._residual, self.plan.segments[index])
        self.batcher = batcher_for(
            packer_for(documents, options, source.manifest.masked),
            options,
            None,
            allocate,
            f"{source.display} epoch {epoch} remainder rank {rank} worker {worker}",
            planned_rows=min(self.plan.sequences),
        )

    def _residual(self, index: int) -> Iterator[np.ndarray]:
        state = self.elastic["slices"][index]
        return residual_documents(self.source, self.options, self.old_plan, index, state)

    def __len__(self) -> int:
        return int(self.batcher.num_batches)  # type: ignore[arg-type]

    def state_dict(self) -> dict:
        return self._wrap(
            **self.identity, elastic=self.elastic, remainder=self.batcher.state_dict()
        )
