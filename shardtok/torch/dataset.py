"""The streaming ``IterableDataset``: ready batches built inside each DataLoader worker.

Use it with ``DataLoader(dataset, batch_size=None, num_workers=K)``. Every worker streams its own
slice of the epoch plan; the DataLoader takes batches from workers round-robin, so every rank
gets ``plan.batches_per_rank`` batches in a fixed order.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from shardtok.stream.pipeline import SliceStream, StreamOptions, plan_for
from shardtok.stream.plan import EpochPlan
from shardtok.stream.sources import DatasetSource
from shardtok.torch.distributed import data_parallel_rank
from shardtok.torch.transport import SlotRing, to_tensors


class ShardStreamDataset(IterableDataset):
    """Packed batches (dicts of tensors) from a shardtok dataset; see ``StreamOptions``.

    ``rank``/``world_size`` default to torch.distributed's when it is initialised. ``set_epoch``
    reaches workers even when they are persistent (the epoch lives in shared memory).
    ``state_dict()``/``load_state_dict()`` hold one worker's stream state: a DataLoader-aware
    checkpointer (torchdata's StatefulDataLoader) calls them inside each worker.
    """

    def __init__(
        self,
        dataset: str | Path,
        *,
        seq_len: int,
        batch_size: int,
        packing: str = "concat",
        seed: int = 0,
        epoch: int = 0,
        shuffle_buffer: int = 4096,
        interleave: int = 4,
        stride: int | None = None,
        lookahead: int = 8,
        pad_id: int = 0,
        mask_boundary_labels: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
        shared_memory: bool = True,
    ):
        super().__init__()
        self.source = DatasetSource(dataset, storage_options)
        self.options = StreamOptions(
            seq_len=seq_len,
            batch_size=batch_size,
            packing=packing,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            interleave=interleave,
            stride=stride,
            lookahead=lookahead,
            pad_id=pad_id,
            mask_boundary_labels=mask_boundary_labels,
        )
        self.rank, self.world_size = rank, world_size
        self.shared_memory = shared_memory
        self._epoch = multiprocessing.RawValue("q", epoch)
        self._stream: SliceStream | None = None
        self._pending_state: dict | None = None
        self._ring: SlotRing | None = None

    # -- epochs and plans -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def plan(self, num_workers: int = 1, epoch: int | None = None) -> EpochPlan:
        """The epoch plan for a DataLoader with `num_workers` workers (0 counts as 1)."""
        _, world_size = data_parallel_rank(self.rank, self.world_size)
        return plan_for(
            self.source,
            self.options,
            epoch=self.epoch if epoch is None else epoch,
            world_size=world_size,
            num_workers=max(num_workers, 1),
        )

    def batches_per_rank(self, num_workers: int = 1) -> int:
        return self.plan(num_workers).batches_per_rank

    # -- iteration ------------------------------------------------------------------------
    def _make_stream(self) -> tuple[SliceStream, SlotRing | None]:
        rank, world_size = data_parallel_rank(self.rank, self.world_size)
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        ring = None
        if self.shared_memory and SlotRing.supported():
            if self._ring is None:  # one per process, kept across epochs
                self._ring = SlotRing(self.options.batch_size, self.options.seq_len)
            ring = self._ring
        stream = SliceStream(
            self.source,
            self.options,
            epoch=self.epoch,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            **({"allocate": ring.allocate} if ring is not None else {}),
        )
        return stream, ring

    def __iter__(self):
        stream, ring = self._make_stream()
        state, self._pending_state = self._pending_state, None
        stream.reset(state)
        self._stream = stream
        # Batches are built in reused slots (no page faults for fresh memory); across a process
        # boundary only a handle is pickled.
        local = get_worker_info() is None
        for batch in stream:
            yield ring.package(batch, local=local) if ring is not None else to_tensors(batch)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This worker's position: the epoch and its stream state (None before iterating)."""
        stream = None if self._stream is None else self._stream.state_dict()
        return {"epoch": self.epoch, "stream": stream}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` at the next iteration (same epoch, rank and worker)."""
        self.set_epoch(int(state["epoch"]))
        self._pending_state = state.get("stream")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_ring"] = None  # each worker process maps its own
        state["_stream"] = None
        if get_spawning_popen() is None:  # a shared value only travels to a spawned child
            state["_epoch"] = int(self._epoch.value)
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["_epoch"], int):
            state["_epoch"] = multiprocessing.RawValue("q", state["_epoch"])
        self.__dict__.update(state)


__all__ = ["ShardStreamDataset"]
