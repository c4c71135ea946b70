"""``SliceStream``: the exact batches of one (rank, worker) in one epoch.

Its state is the batcher's state plus the placement it belongs to, checked on reset.
"""

from __future__ import annotations

import logging

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ShardtokError
from shardtok.stream import state as envelope
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.build import batcher_for, document_stream, packer_for, plan_for, resolved
from shardtok.stream.nodes.base import PlacedStream
from shardtok.stream.options import StreamOptions

logger = logging.getLogger(__name__)


class SliceStream(PlacedStream):
    """The exact batches of one (rank, worker) in one epoch."""

    KIND = "slice_stream"
    FIELDS = {**PlacedStream.PLACEMENT, "batcher": envelope.STATE}
    state_name = "stream"
    resume_hint = (
        "restore with the same epoch, rank, world size, worker and number of workers, or "
        "load every (rank, worker)'s state at once (load_state_dict([...]), merge_states) to "
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
        self.source = source if isinstance(source, DatasetSource) else DatasetSource.of(source)
        options = self.options = resolved(options, [self.source])
        self.epoch = epoch
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.plan = plan_for(
            self.source, options, epoch=epoch, world_size=world_size, num_workers=num_workers
        )
        self.slice = self.plan.slice_for(rank, worker)
        if logger.isEnabledFor(logging.DEBUG):  # once per (rank, worker) and epoch
            s = self.slice
            logger.debug(
                "%s epoch %d, rank %d worker %d: slice %d, %d pieces, %s tokens, %s batches%s",
                self.source.display, epoch, rank, worker, s.index, len(s.pieces),
                f"{s.num_tokens:,}", f"{self.plan.batches_per_slice:,}",
                "\n" + self.plan.summary() if rank == 0 and worker == 0 else "",
            )  # fmt: skip
        if self.plan.batches_per_slice == 0:
            lost = self.plan.overlong_tokens
            lost_text = (
                f" ({lost:,} of them lost to overlong={self.plan.overlong!r})" if lost else ""
            )
            raise ShardtokError(
                f"{self.source.display}: {self.plan.total_tokens:,} tokens{lost_text} cannot "
                f"give every one "
                f"of {len(self.plan.slices)} (rank, worker) slices a batch of "
                f"{options.batch_size} x {options.seq_len + 1}-token sequences; use fewer "
                "ranks, workers or a smaller batch"
            )
        documents = document_stream(self.source, self.slice, options, epoch)
        self.batcher = batcher_for(
            packer_for(documents, options, self.source.manifest.masked),
            options,
            None,
            allocate,
            f"{self.source.display} epoch {epoch} rank {rank} worker {worker}",
            planned_rows=self.plan.min_sequences,
        )

    def __len__(self) -> int:
        """This worker's batches in the epoch (from a state saved with another batch size: its
        batches, then the rest of the epoch's rows in batches of this size)."""
        return int(self.batcher.num_batches)  # type: ignore[arg-type]

    def state_dict(self) -> dict:
        return self._wrap(**self.identity, batcher=self.batcher.state_dict())

    def stats(self) -> dict:
        return self.batcher.stats()
