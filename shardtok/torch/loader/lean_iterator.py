"""One epoch of a ``ShardLoader`` with workers: batches taken round-robin from the workers
that still have some (the DataLoader's order), each worker's position after its last batch
taken, and what ends the epoch (its last batch, an abandoned iterator, a worker's error)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Protocol

import torch

from shardtok.stream.rank import RoundRobin
from shardtok.torch.loader.worker_pool import LoaderWorkerError, WorkerPool
from shardtok.torch.model_inputs import model_batch


class Owner(Protocol):
    """What an epoch uses of its ``ShardLoader``."""

    dataset: Any
    timeout: float
    pin_memory: bool
    _workers: WorkerPool | None

    def _finished(self, iterator: LeanIterator) -> None: ...


class LeanIterator:
    """One epoch of a lean loader: batches round-robin from the workers that still have some."""

    def __init__(self, loader: Owner, workers: WorkerPool, states: list[dict | None], first: int):
        self.loader, self.workers = loader, workers
        self.epoch = getattr(loader.dataset, "epoch", 0)  # the memmap path has no epochs
        self.labels_format = labels_format(loader.dataset)
        self.positions = list(states)
        self.count = len(states)
        self.turns = RoundRobin(self.count, first)
        self.closed = False
        for w, state in enumerate(states):
            workers.start(w, state)

    @property
    def next_worker(self) -> int:
        """The worker whose batch comes next (what a state records)."""
        return self.turns.next_worker

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        while not self.closed and (w := self.turns.take()) is not None:
            try:
                batch, self.positions[w] = self.workers.next_batch(w, self.loader.timeout)
            except BaseException:  # a worker's own error, its death, or an interrupt
                self.close()
                raise
            if batch is None:
                self.turns.done(w)
                continue
            if self.loader.pin_memory and torch.cuda.is_available():
                batch = pin(batch)
            return model_batch(batch, self.labels_format)
        self._end()
        raise StopIteration

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self.loader._finished(self)

    def close(self) -> None:
        """Abandon the rest of the epoch (workers that are still running stop)."""
        if os.getpid() != self.workers.owner:
            return
        if not self.closed:
            try:
                for w in range(self.count):
                    self.workers.stop(w, self.loader.timeout)
            except (OSError, LoaderWorkerError):
                # A worker that died or stopped answering: none of them is reused.
                self.workers.kill()
                if self.loader._workers is self.workers:
                    self.loader._workers = None
        self._end()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def pin(batch: dict) -> dict:
    pinned = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return type(batch)(pinned)


def labels_format(dataset) -> str:
    """The label layout of `dataset`'s batches (a stream's options, or the memmap path's)."""
    options = getattr(dataset, "options", None)
    return options.labels_format if options is not None else dataset.labels_format
