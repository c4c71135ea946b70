"""The memmap path's batches for ``ShardLoader``: what a worker builds for a map-style
``MemmapTokenDataset``.

The epoch's sample order (the sampler's, or 0..len-1) is cut into batches of `batch_size`
(the last one shorter unless `drop_last`); batch ``b`` belongs to worker ``b % K``, as the
DataLoader deals them out, so both loaders yield the same batches in the same order. A worker's
position is how many of its batches were taken: ``{"taken": n}``.
"""

from __future__ import annotations

import numpy as np

from shardtok.stream.batch import allocate_arrays
from shardtok.torch.memmap_plan import BatchPlan
from shardtok.torch.transport import SlotRing


def batch_count(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


class MemmapBatchSource:
    """Worker side: builds this worker's batches of the epoch's order into its slot ring."""

    def __init__(self, dataset, batch_size: int, drop_last: bool):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self._ring: SlotRing | None = None
        self._worker_slot: tuple[int, int] = (0, 1)

    def _start_stream(self, state: dict) -> tuple[MemmapBatches, SlotRing | None]:
        worker, count = self._worker_slot
        batches = MemmapBatches(
            self, np.asarray(state["order"], dtype=np.int64), worker, count, state["taken"]
        )
        return batches, self._ring


class MemmapBatches:
    """One worker's batches of one epoch, from its `taken`-th on, planned in runs (BatchPlan)."""

    # Batches planned together: 1, 2, 4, ... up to RUN, so the first batch (which also checks
    # the crc32 of every frame its plan touches) comes as soon as before.
    RUN = 32

    def __init__(self, source: MemmapBatchSource, order, worker: int, count: int, taken: int):
        self.source, self.order = source, order
        self.worker, self.count, self.taken = worker, count, int(taken)
        self.total = batch_count(len(order), source.batch_size, source.drop_last)
        self._plan: BatchPlan | None = None
        self._planned_from = 0  # the `taken` of the plan's first batch
        self._run = 1  # batches in the next plan

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self.worker + self.taken * self.count >= self.total:
            raise StopIteration
        at = self.taken - self._planned_from
        if self._plan is None or at >= len(self._plan):
            self._plan, self._planned_from, at = self._next_plan(), self.taken, 0
        ring = self.source._ring
        batch = self._plan.batch(at, ring.allocate if ring is not None else allocate_arrays)
        self.taken += 1
        return batch

    def _next_plan(self) -> BatchPlan:
        size = self.source.batch_size
        numbers = range(self.worker + self.taken * self.count, self.total, self.count)
        run, self._run = min(self._run, self.RUN), min(2 * self._run, self.RUN)
        picked = [self.order[b * size : (b + 1) * size] for b in numbers[:run]]
        return self.source.dataset.plan(np.concatenate(picked), [len(p) for p in picked])

    def state_dict(self) -> dict:
        return {"taken": self.taken}


__all__ = ["MemmapBatchSource", "MemmapBatches", "batch_count"]
