"""``MemmapLoader``: ``DataLoader(dataset, batch_size=B, sampler=..., collate_fn=dataset.collate)``
for a ``MemmapTokenDataset``, with the lean hand-over of ``LeanLoader``: the epoch's sample
order (the sampler's, drawn once per epoch as a DataLoader draws it) cut into batches, each
worker building every K-th batch. ``ShardLoader(memmap_dataset, batch_size=B)`` returns one.

Its state (kind ``memmap_loader``) is per worker the number of its batches taken and what the
batches are made from; the order is rebuilt from the sampler on resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import SequentialSampler

from shardtok.errors import ResumeStateError
from shardtok.torch.loader.lean_loader import DEFAULT_PREFETCH, LeanLoader
from shardtok.torch.loader.memmap_batches import MemmapBatches, MemmapBatchSource
from shardtok.torch.loader.saved import memmap_loader_state, parse_loader_state
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from shardtok.torch.model_inputs import model_batch
from shardtok.torch.transport import to_tensors


class MemmapLoader(LeanLoader):
    """Batches of `batch_size` samples of a ``MemmapTokenDataset`` in the sampler's order."""

    def __init__(
        self,
        dataset: MemmapTokenDataset,
        num_workers: int = 0,
        *,
        batch_size: int | None = None,
        sampler: Any = None,
        drop_last: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        timeout: float = 0,
        multiprocessing_context: Any = None,
    ):
        if not isinstance(dataset, MemmapTokenDataset):
            raise TypeError(
                f"MemmapLoader needs a MemmapTokenDataset, got {type(dataset).__name__}"
            )
        if batch_size is None or batch_size < 1:
            raise ValueError("a MemmapTokenDataset needs batch_size >= 1")
        batching = dict(
            batch_size=batch_size, sampler=sampler, drop_last=drop_last,
            collate_fn=dataset.collate,
        )  # fmt: skip
        super().__init__(
            dataset, num_workers, batching, prefetch=prefetch, pin_memory=pin_memory,
            persistent_workers=persistent_workers, timeout=timeout,
            multiprocessing_context=multiprocessing_context,
        )  # fmt: skip
        self._inline: MemmapBatches | None = None  # the batches in process

    def __iter__(self):
        dataset: MemmapTokenDataset = self.dataset  # type: ignore[assignment]
        order = self._epoch_order()  # the sampler is drawn once per epoch, as by a DataLoader
        taken, first = self._resume or ([{"taken": 0}] * max(self.num_workers, 1), 0)
        states = [{"order": order, "taken": t["taken"]} for t in taken]
        source = MemmapBatchSource(dataset, self.batch_size, self.drop_last)  # type: ignore[arg-type]
        if self.num_workers == 0:
            self._resume = None
            return self._pinned(self._in_process(source, states[0]))
        return self._start(source, self.batch_size, dataset.seq_len, states, first)  # type: ignore[arg-type]

    def _in_process(self, source: MemmapBatchSource, state: dict):
        # No slot ring in process: nothing crosses a process, and fresh arrays cost 5-10 µs of
        # CPU less per batch than a slot's views, finalizer and tensors (bench_memmap.py).
        batches, _ = source._start_stream(state)
        self._inline = batches
        labels = source.dataset.labels_format
        for batch in batches:
            yield model_batch(to_tensors(batch), labels)

    def _epoch_order(self) -> np.ndarray:
        if isinstance(self.sampler, SequentialSampler):
            return np.arange(len(self.sampler), dtype=np.int64)
        return np.fromiter(iter(self.sampler), dtype=np.int64)

    def _identity(self) -> dict:
        dataset: MemmapTokenDataset = self.dataset  # type: ignore[assignment]
        return {
            "samples": len(dataset),
            "seq_len": dataset.seq_len,
            "seed": dataset.seed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    def state_dict(self) -> dict:
        """Per worker, how many of its batches were taken (the epoch's order is the sampler's,
        rebuilt on resume: call the sampler's ``set_epoch`` as before)."""
        if self.num_workers == 0 and self._resume is None:
            taken, first = [{"taken": self._inline.taken if self._inline else 0}], 0
        else:
            _, taken, first = self._positions(0, {"taken": 0})
        return memmap_loader_state(
            self.num_workers, first, [t["taken"] for t in taken], self._identity()
        )

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (from ``state_dict()``) at the next ``iter()``: same samples,
        batch size and number of workers."""
        state = parse_loader_state(state, memmap=True)
        if state.get("memmap") != self._identity():
            raise ResumeStateError(
                f"state saved for memmap batches {state.get('memmap')}, this loader makes "
                f"{self._identity()}"
            )
        if int(state["num_workers"]) != self.num_workers:
            raise ResumeStateError(
                f"state saved by a loader with {state['num_workers']} workers, this one has "
                f"{self.num_workers}"
            )
        self._resume = (
            [{"taken": int(w["taken"])} for w in state["workers"]],
            state["next_worker"],
        )
