"""Assembling one (rank, worker)'s stream: plan -> reader -> shuffle -> packer -> batcher.

These are the stages every placed stream (a slice of an epoch, an elastic remainder, a source
of a mix) is made of; ``shardtok.stream.factory`` picks which placed stream a state needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardtok.dataset.source import DatasetSource
from shardtok.stream.batch import Allocator
from shardtok.stream.nodes.base import DocumentNode
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.bfd import BFDPacker
from shardtok.stream.nodes.concat import ConcatPacker
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.stream.nodes.packer import Packer
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.nodes.shuffle import ShuffleBuffer
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan, SlicePlan, epoch_plan

SHUFFLE_STREAM = 2  # rng stream tag of the shuffle buffer's keys


def resolved(options: StreamOptions, sources: Sequence[DatasetSource]) -> StreamOptions:
    """`options` with the values left to the data decided (``StreamOptions.resolve``)."""
    return options.resolve([s.manifest.masked for s in sources])


def plan_for(
    source: DatasetSource,
    options: StreamOptions,
    *,
    epoch: int,
    world_size: int,
    num_workers: int,
) -> EpochPlan:
    options = resolved(options, [source])  # a source of a mix: its own overlong rule
    return epoch_plan(
        source.manifest,
        seq_len=options.seq_len,
        batch_size=options.batch_size,
        seed=options.seed,
        epoch=epoch,
        world_size=world_size,
        num_workers=num_workers,
        packing=options.packing,  # type: ignore[arg-type]  # resolved
        stride=options.stride,
        overlong=options.overlong_for(source.manifest.masked),
        document_sizes=lambda shard: source.document_sizes(source.manifest.shards[shard].file),
    )


def document_stream(
    source: DatasetSource, slice_plan: SlicePlan, options: StreamOptions, epoch: int
) -> DocumentNode:
    masked = source.manifest.masked
    node: DocumentNode = SliceReader(source, slice_plan.pieces, options.interleave, masked)
    if options.shuffle_buffer:
        seed = (options.seed, epoch, SHUFFLE_STREAM, slice_plan.index)
        node = ShuffleBuffer(node, options.shuffle_buffer, seed, options.shuffle_tokens)
    return node


PACKER_CLASSES: dict[str, type[Packer]] = {
    "concat": ConcatPacker,
    "greedy": GreedyPacker,
    "bfd": BFDPacker,
}


def packer_class(packing: str) -> type[ConcatPacker] | type[GreedyPacker] | type[BFDPacker]:
    return PACKER_CLASSES[packing]  # type: ignore[return-value]


def packer_for(documents: DocumentNode, options: StreamOptions, masked: bool) -> Packer:
    """The packer of `options` over `documents`, which carry loss masks when `masked`."""
    packing = options.resolve([masked]).packing if options.packing is None else options.packing
    if packing == "concat":
        return ConcatPacker(documents, options.seq_len, options.stride, masked=masked)
    overlong = options.overlong_for(masked)
    if packing == "bfd":
        return BFDPacker(
            documents, options.seq_len, bfd_window=options.bfd_window, pad_id=options.pad_id,
            overlong=overlong, masked=masked,
        )  # fmt: skip
    return GreedyPacker(
        documents, options.seq_len, lookahead=options.lookahead, pad_id=options.pad_id,
        overlong=overlong, masked=masked,
    )  # fmt: skip


def batcher_for(
    sequences: Packer,
    options: StreamOptions,
    num_batches: int | None,
    allocate: Allocator,
    where: str,
    planned_rows: int | None = None,
) -> Batcher:
    """The batch stage every placed stream ends with (sizes and label masking from `options`);
    `planned_rows` instead of `num_batches` for an epoch's (or a remainder's) slice."""
    return Batcher(
        sequences,
        options.batch_size,
        num_batches=num_batches,
        planned_rows=planned_rows,
        mask_boundary_labels=options.mask_boundary_labels,
        labels_format=options.labels_format,
        allocate=allocate,
        where=where,
    )
