"""Assembling one (rank, worker)'s stream: plan -> reader -> shuffle -> packer -> batcher.

These are the stages every placed stream (a slice of an epoch, an elastic remainder, a source
of a mix) is made of; ``shardtok.stream.factory`` picks which placed stream a state needs.
"""

from __future__ import annotations

from shardtok.errors import UsageError
from shardtok.storage.dataset import DatasetSource
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


def refuse_masked(source: DatasetSource) -> None:
    """A dataset with loss masks (fine-tuning data) is refused until the stream applies them:
    streamed as plain tokens it would train on every token, prompts included."""
    if source.manifest.masked:
        raise UsageError(
            f"{source.display}: this dataset has loss masks (fine-tuning data), and this "
            "release's stream and memmap paths do not apply them yet; streaming it would train "
            "on every token. Read its masks with shardtok.format.ShardReader(...)"
            ".documents(with_masks=True)"
        )


def plan_for(
    source: DatasetSource,
    options: StreamOptions,
    *,
    epoch: int,
    world_size: int,
    num_workers: int,
) -> EpochPlan:
    refuse_masked(source)
    return epoch_plan(
        source.manifest,
        seq_len=options.seq_len,
        batch_size=options.batch_size,
        seed=options.seed,
        epoch=epoch,
        world_size=world_size,
        num_workers=num_workers,
        packing=options.packing,
        stride=options.stride,
    )


def document_stream(
    source: DatasetSource, slice_plan: SlicePlan, options: StreamOptions, epoch: int
) -> DocumentNode:
    node: DocumentNode = SliceReader(source, slice_plan.pieces, options.interleave)
    if options.shuffle_buffer:
        seed = (options.seed, epoch, SHUFFLE_STREAM, slice_plan.index)
        node = ShuffleBuffer(node, options.shuffle_buffer, seed)
    return node


PACKER_CLASSES: dict[str, type[Packer]] = {
    "concat": ConcatPacker,
    "greedy": GreedyPacker,
    "bfd": BFDPacker,
}


def packer_class(packing: str) -> type[ConcatPacker] | type[GreedyPacker] | type[BFDPacker]:
    return PACKER_CLASSES[packing]  # type: ignore[return-value]


def packer_for(documents: DocumentNode, options: StreamOptions) -> Packer:
    if options.packing == "concat":
        return ConcatPacker(documents, options.seq_len, options.stride)
    if options.packing == "bfd":
        return BFDPacker(
            documents, options.seq_len, bfd_window=options.bfd_window, pad_id=options.pad_id
        )
    return GreedyPacker(
        documents, options.seq_len, lookahead=options.lookahead, pad_id=options.pad_id
    )


def batcher_for(
    sequences: Packer,
    options: StreamOptions,
    num_batches: int,
    allocate: Allocator,
    where: str,
) -> Batcher:
    """The batch stage every placed stream ends with (sizes and label masking from `options`)."""
    return Batcher(
        sequences,
        options.batch_size,
        num_batches=num_batches,
        mask_boundary_labels=options.mask_boundary_labels,
        labels_format=options.labels_format,
        allocate=allocate,
        where=where,
    )
