"""``ShardLoader``: a DataLoader for ``ShardStreamDataset`` and ``MemmapTokenDataset`` whose
workers hand batches over without the DataLoader's queues.

Why: a DataLoader moves every item through an index queue and a result queue, each with a
feeder thread, locks and pickling. With workers that do nothing at all it costs the main process
120-145 µs of CPU per batch on a 2-core VM, half to two thirds of a core at 75 M tokens/s of
8 x 2048 batches, which leaves the workers too little CPU to build them.

How (``worker_pool.py``): each worker builds batches in a shared-memory slot ring created before
the worker starts and sends one small message per batch through its own pipe: the slot and its
position after that batch (the whole batch, pickled, without shared memory). It runs under every
start method: the ring, pipes and semaphores come from the loader's multiprocessing context and
reach a spawned or forkserver worker as its arguments. A worker runs at most `prefetch` batches
ahead of what the main process has taken from it. Here: batches are taken round-robin from the
workers that still have batches, which is the DataLoader's order, so both loaders yield the same
stream, and ``state_dict()`` is the position of the last batch taken from each worker.

Private DataLoader attributes used: none. The loader is a DataLoader subclass only so that code
checking ``isinstance(loader, DataLoader)`` accepts it; it reads the public attributes the
constructor sets (``num_workers``, ``batch_size``, ``sampler``, ``drop_last``, ``pin_memory``,
``timeout``, ``persistent_workers``, ``multiprocessing_context``), never calls the DataLoader's
iterator, and keeps its own workers and positions, so no private hook is needed.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, SequentialSampler

from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.resume.merge import cuts_rows_anew
from shardtok.stream.resume.saved import MergedState, Placement, WorkerState
from shardtok.torch.dataset import ShardStreamDataset
from shardtok.torch.distributed import data_parallel_rank
from shardtok.torch.loader.lean_iterator import LeanIterator, pin
from shardtok.torch.loader.memmap_batches import MemmapBatches, MemmapBatchSource
from shardtok.torch.loader.saved import loader_state, memmap_loader_state, parse_loader_state
from shardtok.torch.loader.worker_pool import LoaderWorkerError, WorkerPool
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from shardtok.torch.model_inputs import model_batch
from shardtok.torch.transport import SlotRing, to_tensors

DEFAULT_PREFETCH = 4


class ShardLoader(DataLoader):
    """``DataLoader(dataset, batch_size=None, ...)`` for a ``ShardStreamDataset``, or
    ``DataLoader(dataset, batch_size=B, sampler=..., collate_fn=dataset.collate, ...)`` for a
    ``MemmapTokenDataset``, with a lean hand-over from the workers: the same batches in the same
    order, at a fraction of the DataLoader's per-batch cost in the main process.

    `prefetch` is how many batches each worker may build ahead (the DataLoader's
    ``prefetch_factor``). ``state_dict()``/``load_state_dict()`` save and restore the position
    of every worker (what ``StatefulDataLoader`` does for a plain DataLoader); the saved state
    is plain data. Every start method (``multiprocessing_context``: fork, forkserver, spawn)
    runs the same workers and resumes the same way; with ``shared_memory=False`` or without
    ``memfd`` the batches travel pickled through the workers' pipes (slower, same states).
    """

    def __init__(
        self,
        dataset: ShardStreamDataset | MemmapTokenDataset,
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
        self._memmap = isinstance(dataset, MemmapTokenDataset)
        if self._memmap:
            if batch_size is None or batch_size < 1:
                raise ValueError("a MemmapTokenDataset needs batch_size >= 1")
            batching: dict[str, Any] = dict(
                batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                collate_fn=dataset.collate,  # type: ignore[union-attr]
            )  # fmt: skip
        elif isinstance(dataset, ShardStreamDataset):
            if dataset.yields_samples:
                raise UsageError(
                    "ShardLoader hands over whole batches: give the ShardStreamDataset "
                    "batch_size (a dataset without it yields single sequences, for a "
                    "DataLoader's own batching)"
                )
            if batch_size is not None or sampler is not None:
                raise ValueError(
                    "a ShardStreamDataset builds its own batches: set batch_size on the dataset "
                    "and leave the loader's batch_size and sampler unset"
                )
            batching = dict(batch_size=None)
            hint = dataset.num_workers
            if hint is not None and max(hint, 1) != max(num_workers, 1):
                raise UsageError(
                    f"ShardStreamDataset(num_workers={hint}) in a ShardLoader with "
                    f"num_workers={num_workers}: give both the same count"
                )
        else:
            raise TypeError(
                "ShardLoader needs a ShardStreamDataset or a MemmapTokenDataset, got "
                f"{type(dataset).__name__}"
            )
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
        self._resume: tuple[list[dict | None], int] | None = None
        self._ended: LeanIterator | None = None  # the last epoch that ended or was left
        self._inline: MemmapBatches | None = None  # the memmap path's batches, in process

    def __len__(self) -> int:
        """Batches per epoch: for a ``ShardStreamDataset``, exactly what a rank yields with
        this loader's workers (``dataset.batches_per_rank(num_workers)``); for a
        ``MemmapTokenDataset``, the DataLoader's count."""
        if self._memmap:
            return super().__len__()
        return self.dataset.batches_per_rank(self.num_workers)  # type: ignore[attr-defined]

    @property
    def lean(self) -> bool:
        """Whether batches come through shardtok's own workers (always, when there are any)."""
        return self.num_workers > 0

    @property
    def zero_copy(self) -> bool:
        """Whether workers hand batches over in shared memory (else pickled through a pipe)."""
        return self.dataset.shared_memory and SlotRing.supported()  # type: ignore[attr-defined]

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self):
        if self._memmap:
            return self._iter_memmap()
        dataset: ShardStreamDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            return self._pinned(iter(dataset))
        options = dataset.options
        dataset._in_workers.value = 1  # from now on the position lives in the workers
        states, first = self._resume or ([None] * self.num_workers, 0)
        if self._resume is None and dataset._pending_state is not None:
            states = [dataset._pending_state] * self.num_workers  # a merged (elastic) state
            dataset._pending_state = None
        return self._start(dataset, options.batch_size, options.seq_len, states, first)

    def _iter_memmap(self):
        dataset: MemmapTokenDataset = self.dataset  # type: ignore[assignment]
        order = self._epoch_order()  # the sampler is drawn once per epoch, as by a DataLoader
        taken, first = self._resume or ([{"taken": 0}] * max(self.num_workers, 1), 0)
        states = [{"order": order, "taken": t["taken"]} for t in taken]
        source = MemmapBatchSource(dataset, self.batch_size, self.drop_last)  # type: ignore[arg-type]
        if self.num_workers == 0:
            self._resume = None
            return self._pinned(self._memmap_in_process(source, states[0]))
        return self._start(source, self.batch_size, dataset.seq_len, states, first)  # type: ignore[arg-type]

    def _memmap_in_process(self, source: MemmapBatchSource, state: dict):
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

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain data: the position after the last batch this loader yielded, per worker."""
        if self._memmap:
            return self._memmap_state()
        dataset: ShardStreamDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            return loader_state(0, 0, [dataset.state_dict()])
        epoch, streams, first = self._positions(dataset.epoch, dataset._pending_state)
        rank, world_size = data_parallel_rank(dataset.rank, dataset.world_size)
        workers = [
            stream.to_dict()  # a merged state not yet started: every worker starts from it
            if isinstance(stream, MergedState)
            else dataset._state(
                stream, Placement(rank, world_size, w, self.num_workers), epoch=epoch
            )
            for w, stream in enumerate(streams)
        ]
        return loader_state(self.num_workers, first, workers)

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

    def _memmap_identity(self) -> dict:
        dataset: MemmapTokenDataset = self.dataset  # type: ignore[assignment]
        return {
            "samples": len(dataset),
            "seq_len": dataset.seq_len,
            "seed": dataset.seed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    def _memmap_state(self) -> dict:
        """Per worker, how many of its batches were taken (the epoch's order is the sampler's,
        rebuilt on resume: call the sampler's ``set_epoch`` as before)."""
        if self.num_workers == 0 and self._resume is None:
            taken, first = [{"taken": self._inline.taken if self._inline else 0}], 0
        else:
            _, taken, first = self._positions(0, {"taken": 0})
        return memmap_loader_state(
            self.num_workers, first, [t["taken"] for t in taken], self._memmap_identity()
        )

    def load_state_dict(self, state: dict | list) -> None:
        """Continue from `state` (from ``state_dict()``) at the next ``iter()``: exactly, from a
        loader with as many workers in the same place, or by the remainder rule for another
        layout (docs/STREAMING.md): a list of every rank's loader states, or one rank's state
        when it was the only rank (world size 1), with another number of workers or sequence
        length. Either may have another batch size."""
        dataset: ShardStreamDataset = self.dataset  # type: ignore[assignment]
        if isinstance(state, (list, tuple)) and not self._memmap:
            dataset.load_state_dict(list(state))
            self._resume = None
            return
        state = parse_loader_state(state, memmap=self._memmap)
        workers = state["workers"]
        if self._memmap and state.get("memmap") != self._memmap_identity():
            raise ResumeStateError(
                f"state saved for memmap batches {state.get('memmap')}, this loader makes "
                f"{self._memmap_identity()}"
            )
        if not self._memmap and self._other_layout(state):
            placements = [w.get("placement") or {} for w in workers if isinstance(w, dict)]
            if all(p.get("world_size") == 1 for p in placements):  # the only rank: all of it
                dataset.load_state_dict(list(workers))
                self._resume = None
                return
            raise ResumeStateError(
                f"state saved by a loader with {state['num_workers']} workers of rank "
                f"{placements[0].get('rank')} of {placements[0].get('world_size')}, this one "
                f"has {self.num_workers} workers: to change the layout pass every rank's loader "
                "state, loader.load_state_dict([rank 0's, rank 1's, ...])"
            )
        if int(state["num_workers"]) != self.num_workers:
            raise ResumeStateError(
                f"state saved by a loader with {state['num_workers']} workers, this one has "
                f"{self.num_workers}"
            )
        if self._memmap:
            self._resume = ([{"taken": int(w["taken"])} for w in workers], state["next_worker"])
            return
        if self.num_workers == 0:
            dataset.load_state_dict(workers[0])
            return
        saved = [dataset.parse_state(w) for w in workers]
        for w, s in enumerate(saved):
            if isinstance(s, WorkerState) and s.placement.worker != w:
                raise ResumeStateError(
                    f"loader state: workers[{w}] holds worker {s.placement.worker}'s position"
                )
        if len({s.epoch for s in saved}) != 1:
            raise ResumeStateError("loader state: workers of different epochs")
        dataset.set_epoch(saved[0].epoch)
        positions = [s if isinstance(s, MergedState) else s.stream for s in saved]
        self._resume = (positions, state["next_worker"])

    def _other_layout(self, state: dict) -> bool:
        """Whether a parsed loader `state` needs the remainder rule here: other workers, rank
        or world size, or rows of another length."""
        dataset: ShardStreamDataset = self.dataset  # type: ignore[assignment]
        if int(state["num_workers"]) != self.num_workers:
            return True
        rank, world_size = data_parallel_rank(dataset.rank, dataset.world_size)
        for w in state["workers"]:
            placement = w.get("placement") if isinstance(w, dict) else None
            if placement is None:  # a merged state not yet started: it is a layout's start
                continue
            if (placement.get("rank"), placement.get("world_size")) != (rank, world_size):
                return True
            if cuts_rows_anew(w.get("fingerprint"), dataset.options):
                return True
        return False

    def __del__(self):
        workers = getattr(self, "_workers", None)
        if workers is not None:
            workers.shutdown()


__all__ = ["LoaderWorkerError", "ShardLoader"]
