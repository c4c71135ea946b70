"""What both of shardtok's loaders share: a ``DataLoader`` subclass whose workers hand batches
over without the DataLoader's queues.

Why: a DataLoader moves every item through an index queue and a result queue, each with a
feeder thread, locks and pickling. With workers that do nothing at all it costs the main process
120-145 µs of CPU per batch on a 2-core VM, half to two thirds of a core at 75 M tokens/s of
8 x 2048 batches, which leaves the workers too little CPU to build them.

How (``worker_pool.py``): each worker builds batches in a shared-memory slot ring created before
the worker starts and sends one small message per batch through its own pipe: the slot and its
position after that batch (the whole batch, pickled, without shared memory). It runs under every
start method: the ring, pipes and semaphores come from the loader's multiprocessing context and
reach a spawned or forkserver worker as its arguments. A worker runs at most `prefetch` batches
ahead of what the main process has taken from it. Batches are taken round-robin from the
workers that still have batches (``lean_iterator.py``), which is the DataLoader's order, so both
loaders yield the same stream, and ``state_dict()`` is the position of the last batch taken from
each worker.

Private DataLoader attributes used: none. The loaders are DataLoader subclasses only so that
code checking ``isinstance(loader, DataLoader)`` accepts them; they read the public attributes
the constructor sets (``num_workers``, ``batch_size``, ``sampler``, ``drop_last``,
``pin_memory``, ``timeout``, ``persistent_workers``, ``multiprocessing_context``), never call the
DataLoader's iterator, and keep their own workers and positions, so no private hook is needed.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import torch
from torch.utils.data import DataLoader

from shardtok.torch.loader.lean_iterator import LeanIterator, pin
from shardtok.torch.loader.worker_pool import WorkerPool
from shardtok.torch.transport import SlotRing

DEFAULT_PREFETCH = 4


class LeanLoader(DataLoader):
    """The worker pool, the epochs and the positions both loaders keep; a subclass says how its
    dataset's batches are made (``ShardLoader``: the stream builds them; ``MemmapLoader``: the
    sampler's order cut into batches)."""

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        batching: dict[str, Any],
        *,
        prefetch: int,
        pin_memory: bool,
        persistent_workers: bool,
        timeout: float,
        multiprocessing_context: Any,
    ):
        if not 1 <= prefetch <= 30:
            raise ValueError(f"prefetch must lie in [1, 30], got {prefetch}")
        super().__init__(
            dataset,
            **batching,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context,
            prefetch_factor=prefetch if num_workers else None,
        )
        self.prefetch = prefetch
        self._workers: WorkerPool | None = None
        self._active: LeanIterator | None = None
        self._resume: tuple[list, int] | None = None
        self._ended: LeanIterator | None = None  # the last epoch that ended or was left

    @property
    def lean(self) -> bool:
        """Whether batches come through shardtok's own workers (always, when there are any)."""
        return self.num_workers > 0

    @property
    def zero_copy(self) -> bool:
        """Whether workers hand batches over in shared memory (else pickled through a pipe)."""
        return self.dataset.shared_memory and SlotRing.supported()  # type: ignore[attr-defined]

    def _start(self, source, batch_size: int, seq_len: int, states: list, first: int):
        if self._active is not None:
            self._active.close()
        if self._workers is None or not self._workers.alive():
            context = self.multiprocessing_context or multiprocessing.get_context()
            self._workers = WorkerPool(
                source, self.num_workers, self.prefetch, context, batch_size, seq_len,
                shared=self.zero_copy,
            )  # fmt: skip
        self._resume = None
        self._active = LeanIterator(self, self._workers, states, first)
        return self._active

    def _pinned(self, batches):
        if not (self.pin_memory and torch.cuda.is_available()):
            return batches
        return (pin(batch) for batch in batches)

    def _finished(self, iterator: LeanIterator) -> None:
        """An epoch ended or was abandoned: keep persistent workers, end the others."""
        if self._active is iterator:
            self._active = None
            self._ended = iterator
        if not self.persistent_workers and self._workers is iterator.workers:
            self._workers.shutdown()
            self._workers = None

    def _positions(self, epoch: int, fresh) -> tuple[int, list, int]:
        """(epoch, per-worker positions, next worker) after the last batch yielded: a loaded
        state not yet used, the running epoch, the epoch that ended, or `fresh` everywhere when
        nothing of `epoch` has been read yet (a ``set_epoch`` after the last one ended)."""
        if self._resume is not None:
            return epoch, *self._resume
        if self._active is not None:
            return self._active.epoch, self._active.positions, self._active.next_worker
        if self._ended is not None and self._ended.epoch == epoch:
            return epoch, self._ended.positions, self._ended.next_worker
        return epoch, [fresh] * self.num_workers, 0

    def __del__(self):
        workers = getattr(self, "_workers", None)
        if workers is not None:
            workers.shutdown()
