"""Assembling one (rank, worker)'s stream for one epoch: plan -> reader -> shuffle -> packer -> batcher.

``StreamOptions`` holds everything that decides the tokens (besides the dataset, epoch, rank
and worker); it is JSON-able so resume can fingerprint it. ``SliceStream`` is the node a worker
iterates; its state is the batcher's state plus the identity it belongs to, checked on reset.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shardtok.errors import ShardtokError
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.batcher import Batcher
from shardtok.stream.concat import ConcatPacker
from shardtok.stream.greedy import GreedyPacker
from shardtok.stream.node import DocumentNode, PlacedStream
from shardtok.stream.plan import EpochPlan, SlicePlan, epoch_plan
from shardtok.stream.reader import SliceReader
from shardtok.stream.sequence import Packer
from shardtok.stream.shuffle import ShuffleBuffer
from shardtok.stream.sources import DatasetSource

SHUFFLE_STREAM = 2  # rng stream tag of the shuffle buffer's keys


@dataclass(frozen=True)
class StreamOptions:
    seq_len: int
    batch_size: int
    packing: str = "concat"  # or "greedy"
    seed: int = 0
    shuffle_buffer: int = 4096  # documents; 0 turns shuffling off
    interleave: int = 4  # shards read round-robin at once by each worker
    stride: int | None = None  # concat: None = seq_len + 1; seq_len = Megatron's overlap
    lookahead: int = 8  # greedy: open sequences
    pad_id: int = 0  # greedy: padding token (its labels are always -100)
    mask_boundary_labels: bool = False  # -100 on labels whose target starts another document

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StreamOptions:
        return cls(**data)


def plan_for(
    source: DatasetSource,
    options: StreamOptions,
    *,
    epoch: int,
    world_size: int,
    num_workers: int,
) -> EpochPlan:
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


def packer_for(documents: DocumentNode, options: StreamOptions) -> Packer:
    if options.packing == "concat":
        return ConcatPacker(documents, options.seq_len, options.stride)
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
        allocate=allocate,
        where=where,
    )


class SliceStream(PlacedStream):
    """The exact batches of one (rank, worker) in one epoch."""

    state_name = "stream"
    resume_hint = (
        "restore with the same epoch, rank, world size, worker and number of workers, or "
        "merge every (rank, worker)'s state with shardtok.stream.elastic.merge_states to "
        "finish the epoch with another layout"
    )

    def __init__(
        self,
        source: DatasetSource | str,
        options: StreamOptions,
        *,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        allocate: Allocator = allocate_arrays,
    ):
        super().__init__()
        self.source = source if isinstance(source, DatasetSource) else DatasetSource(source)
        self.options = options
        self.epoch = epoch
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.plan = plan_for(
            self.source, options, epoch=epoch, world_size=world_size, num_workers=num_workers
        )
        self.slice = self.plan.slice_for(rank, worker)
        if self.plan.batches_per_slice == 0:
            raise ShardtokError(
                f"{self.source.location}: {self.plan.total_tokens:,} tokens cannot give every one "
                f"of {len(self.plan.slices)} (rank, worker) slices a batch of "
                f"{options.batch_size} x {options.seq_len + 1}-token sequences; use fewer "
                "ranks, workers or a smaller batch"
            )
        documents = document_stream(self.source, self.slice, options, epoch)
        self.batcher = batcher_for(
            packer_for(documents, options),
            options,
            self.plan.batches_per_slice,
            allocate,
            f"{self.source.location} epoch {epoch} rank {rank} worker {worker}",
        )

    def __len__(self) -> int:
        return self.plan.batches_per_slice

    def state_dict(self) -> dict:
        return {**self.identity, "batcher": self.batcher.state_dict()}

    def stats(self) -> dict:
        return self.batcher.stats()
