"""``ShardLoader``: ``DataLoader(dataset, batch_size=None, ...)`` for a ``ShardStreamDataset``,
with the lean hand-over of ``LeanLoader`` (lean_loader.py says why and how): the same batches
in the same order, at a fraction of the DataLoader's per-batch cost in the main process.

Given a ``MemmapTokenDataset`` it returns a ``MemmapLoader`` (memmap_loader.py), the loader of
the random-access path, so one name serves both as it always did.
"""

from __future__ import annotations

from typing import Any

from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.resume.merge import cuts_rows_anew
from shardtok.stream.resume.saved import MergedState, Placement, WorkerState
from shardtok.torch.dataset import ShardStreamDataset
from shardtok.torch.distributed import data_parallel_rank
from shardtok.torch.loader.lean_loader import DEFAULT_PREFETCH, LeanLoader
from shardtok.torch.loader.memmap_loader import MemmapLoader
from shardtok.torch.loader.saved import loader_state, parse_loader_state
from shardtok.torch.memmap_dataset import MemmapTokenDataset


class ShardLoader(LeanLoader):
    """``DataLoader(dataset, batch_size=None, ...)`` for a ``ShardStreamDataset``, with a lean
    hand-over from the workers.

    `prefetch` is how many batches each worker may build ahead (the DataLoader's
    ``prefetch_factor``). ``state_dict()``/``load_state_dict()`` save and restore the position
    of every worker (what ``StatefulDataLoader`` does for a plain DataLoader); the saved state
    is plain data. Every start method (``multiprocessing_context``: fork, forkserver, spawn)
    runs the same workers and resumes the same way; with ``shared_memory=False`` or without
    ``memfd`` the batches travel pickled through the workers' pipes (slower, same states).
    ``ShardLoader(MemmapTokenDataset, batch_size=B, sampler=...)`` is a ``MemmapLoader``.
    """

    def __new__(cls, dataset=None, *args: Any, **kwargs: Any):
        if cls is ShardLoader and isinstance(dataset, MemmapTokenDataset):
            loader = MemmapLoader.__new__(MemmapLoader)
            loader.__init__(dataset, *args, **kwargs)  # not a ShardLoader: Python will not
            return loader
        return super().__new__(cls)

    def __init__(
        self,
        dataset: ShardStreamDataset,
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
        if not isinstance(dataset, ShardStreamDataset):
            raise TypeError(
                "ShardLoader needs a ShardStreamDataset or a MemmapTokenDataset, got "
                f"{type(dataset).__name__}"
            )
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
        hint = dataset.num_workers
        if hint is not None and max(hint, 1) != max(num_workers, 1):
            raise UsageError(
                f"ShardStreamDataset(num_workers={hint}) in a ShardLoader with "
                f"num_workers={num_workers}: give both the same count"
            )
        super().__init__(
            dataset, num_workers, dict(batch_size=None), prefetch=prefetch,
            pin_memory=pin_memory, persistent_workers=persistent_workers, timeout=timeout,
            multiprocessing_context=multiprocessing_context,
        )  # fmt: skip

    def __len__(self) -> int:
        """Batches per epoch: exactly what a rank yields with this loader's workers
        (``dataset.batches_per_rank(num_workers)``)."""
        return self.dataset.batches_per_rank(self.num_workers)  # type: ignore[attr-defined]

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self):
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

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain data: the position after the last batch this loader yielded, per worker."""
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

    def load_state_dict(self, state: dict | list) -> None:
        """Continue from `state` (from ``state_dict()``) at the next ``iter()``: exactly, from a
        loader with as many workers in the same place, or by the remainder rule for another
        layout (docs/RESUME.md): a list of every rank's loader states, or one rank's state
        when it was the only rank (world size 1), with another number of workers or sequence
        length. Either may have another batch size."""
        dataset: ShardStreamDataset = self.dataset  # type: ignore[assignment]
        if isinstance(state, (list, tuple)):
            dataset.load_state_dict(list(state))
            self._resume = None
            return
        state = parse_loader_state(state, memmap=False)
        workers = state["workers"]
        if self._other_layout(state):
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


__all__ = ["ShardLoader"]
