"""The streaming ``IterableDataset``: ready batches built inside each DataLoader worker.

Use it with ``DataLoader(dataset, batch_size=None, num_workers=K)``. Every worker streams its own
slice of the epoch plan; the DataLoader takes batches from workers round-robin, so every rank
gets ``plan.batches_per_rank`` batches in a fixed order.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError, ShardtokError, UsageError
from shardtok.storage.retry import RetryPolicy
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.spec import MixSpec
from shardtok.stream.mix.stages import Curriculum, load_curriculum, load_stage
from shardtok.stream.nodes.base import PlacedStream
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan
from shardtok.stream.resume.merge import loadable
from shardtok.stream.resume.saved import MergedState, Placement, WorkerState
from shardtok.torch.dataset_args import stream_options_of, stream_source
from shardtok.torch.distributed import data_parallel_rank
from shardtok.torch.lengths import check_num_batches, check_worker_count, per_worker
from shardtok.torch.model_inputs import model_batch, model_sample, warn_if_transformers_mixes
from shardtok.torch.transport import SlotRing, to_tensors

_WORKERS_HOLD_STATE = (
    "ShardStreamDataset.state_dict() was called in the main process while DataLoader workers "
    "stream it: the position lives in the workers. Checkpoint the loader instead "
    "(shardtok.torch.ShardLoader.state_dict(), or torchdata's StatefulDataLoader)"
)


class ShardStreamDataset(IterableDataset):
    """Packed batches (dicts of tensors) from a shardtok dataset; see ``StreamOptions``.

    ``rank``/``world_size`` default to torch.distributed's when it is initialised. ``set_epoch``
    reaches workers even when they are persistent (the epoch lives in shared memory).
    ``state_dict()``/``load_state_dict()`` hold one worker's stream state: a DataLoader-aware
    checkpointer (torchdata's StatefulDataLoader) calls them inside each worker.

    `dataset` is one dataset (a path or URL: an epoch of it, ``plan().batches_per_rank``
    batches; with `num_batches`, that many batches per rank, rounded up as for a mix, over
    epochs ``epoch``, ``epoch + 1``, ... each exactly as streamed alone) or a subset of one
    dataset's shards (a ``.tar`` path or URL, a brace pattern ``"data/shard-{000000..000009}.tar"``,
    a local glob ``"data/shard-*.tar"``, or a list of those: planned as a dataset of just
    those shards), or a weighted mix: a ``{path: weight}`` mapping (a key may be a subset) or a
    ``MixSpec``; a mix yields `num_batches` batches per rank (rounded
    up to a multiple of the number of workers) from an endless schedule over source epochs.
    A list is never a mix: shards of two datasets in one list are refused.
    A ``Curriculum`` (``from_config``) runs its stages in order, each from its start step on,
    its sources continuing where the earlier stages left them (``stage_switch: restart``: each
    stage a fresh mix), for `num_batches` batches per rank.
    Saved states carry a fingerprint of the sources and options; `strict=False` resumes even
    when it differs.
    """

    def __init__(
        self,
        dataset: str | Path | Sequence[str | Path] | DatasetSource | Mapping | MixSpec | Curriculum,
        *,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        shared_memory: bool = True,
        num_batches: int | None = None,
        num_workers: int | None = None,
        strict: bool = True,
        allow_mixed_tokenizers: bool = False,
        options: StreamOptions | None = None,
        **stream_options: Any,
    ):
        """`stream_options` are ``StreamOptions`` fields (``seq_len`` and ``batch_size`` are
        required, ``packing``, ``seed``, ``shuffle_buffer``...), or pass `options` whole.

        `retry`: how every source's remote reads are retried (``RetryPolicy(max_attempts=...,
        timeout=...)``); None leaves each source its own (the default policy unless a
        ``DatasetSource`` was given with one).

        Every source's manifest is read here, so a missing or damaged dataset fails at
        construction rather than in a DataLoader worker. A mix of datasets tokenized
        differently is refused unless `allow_mixed_tokenizers` (or the mix config says so).

        `num_workers`: the DataLoader workers this dataset will run under, which ``len()``
        counts for (None: 1, in process). A DataLoader running it with another count is an
        error when it was given, else a warning if ``len()`` was used (``ShardLoader``'s own
        ``len()`` is exact for its workers)."""
        super().__init__()
        options, self.yields_samples = stream_options_of(options, stream_options)
        dataset = stream_source(dataset, storage_options, retry, allow_mixed_tokenizers)
        check_num_batches(dataset, num_batches)
        self.setup = StreamSetup.of(dataset, options)
        warn_if_transformers_mixes(options.labels_format)
        for each in self.setup.sources:
            each.manifest  # noqa: B018 - read now: fail here, not in a worker
        self.num_batches = num_batches
        if num_workers is not None and num_workers < 0:
            raise UsageError(f"num_workers must be >= 0, got {num_workers}")
        self.num_workers = num_workers
        self._len_workers: int | None = None  # the worker count len() counted for, once used
        self.strict = strict
        self.rank, self.world_size = rank, world_size
        self.shared_memory = shared_memory
        self._epoch = multiprocessing.RawValue("q", epoch)
        # Set once a DataLoader worker of this dataset streams: from then on the position lives
        # in the workers, and the main process's state_dict() refuses instead of restarting.
        self._in_workers = multiprocessing.RawValue("b", 0)
        self._stream: PlacedStream | None = None
        self._pending_state: dict | MergedState | None = None
        self._ring: SlotRing | None = None
        self._worker_slot: tuple[int, int] | None = None  # (worker, num_workers) in a ShardLoader

    @classmethod
    def from_config(cls, config: str | Path | dict, *, stage: str | int | None = None, **kwargs):
        """A dataset from a YAML mix config (Nanotron style); keyword arguments override it.

        `stage` None runs every ``data_stages`` entry in order (``num_batches`` required: the
        last stage never ends); a config with one stage is that stage's mix, exactly as a plain
        mix. `stage` (an index or a name) runs that stage alone, as a plain mix."""
        storage_options = kwargs.pop("storage_options", None)
        if stage is not None:
            spec = load_stage(config, stage, storage_options=storage_options)
            return cls(spec, **{**spec.options, **kwargs})
        curriculum = load_curriculum(config, storage_options=storage_options)
        if len(curriculum.stages) == 1:
            spec = curriculum.stage_spec(0)
            return cls(spec, **{**spec.options, **kwargs})
        return cls(curriculum, **{**curriculum.options, **kwargs})

    # -- what is streamed -----------------------------------------------------------------
    @property
    def options(self) -> StreamOptions:
        return self.setup.options

    @property
    def mix(self) -> MixSpec | None:
        return self.setup.mix

    @property
    def curriculum(self) -> Curriculum | None:
        """The stages streamed (None: one dataset or one mix)."""
        return self.setup.curriculum

    @property
    def sources(self) -> list[DatasetSource]:
        return list(self.setup.sources)

    @property
    def source(self) -> DatasetSource:
        return self.setup.sources[0]

    @property
    def fingerprint(self) -> dict:
        return self.setup.fingerprint

    # -- epochs and plans -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def plan(self, num_workers: int = 1, epoch: int | None = None) -> EpochPlan:
        """The epoch plan for a DataLoader with `num_workers` workers (0 counts as 1)."""
        if self.mix is not None or self.curriculum is not None:
            raise ShardtokError("a mixed dataset has no single epoch plan (see num_batches)")
        _, world_size = data_parallel_rank(self.rank, self.world_size)
        return self.setup.plan(
            epoch=self.epoch if epoch is None else epoch,
            world_size=world_size,
            num_workers=max(num_workers, 1),
        )

    def batches_per_rank(self, num_workers: int = 1) -> int:
        """Batches a rank yields with `num_workers` DataLoader workers (0 counts as 1):
        ``ceil(num_batches / K) * K`` with `num_batches`, else one epoch's
        ``plan(K).batches_per_rank`` (after loading another layout's states: what the
        remainder yields); a mix without `num_batches` has none (TypeError)."""
        workers = max(num_workers, 1)
        if self.num_batches is not None:
            return per_worker(self.num_batches, workers) * workers
        if self.mix is not None or self.curriculum is not None:
            raise TypeError(
                "a mixed dataset without num_batches never ends: it has no length (give "
                "num_batches, batches per rank)"
            )
        if isinstance(self._pending_state, MergedState):
            # The epoch this loads into is what another layout left of one: every worker
            # yields the remainder's batches (``ElasticPlan.batches_per_slice``).
            rank, world_size = data_parallel_rank(self.rank, self.world_size)
            placement = Placement(rank, world_size, 0, workers)
            stream = self.setup.stream(placement, epoch=self.epoch, resume=self._pending_state)
            return len(stream) * workers
        return self.plan(workers).batches_per_rank

    def __len__(self) -> int:
        """Batches per rank (see ``batches_per_rank``) under the `num_workers` given to the
        constructor (None: 1, in process)."""
        workers = max(self.num_workers or 0, 1)
        length = self.batches_per_rank(workers)
        self._len_workers = workers
        return length

    # -- iteration ------------------------------------------------------------------------
    def _placement(self) -> Placement:
        rank, world_size = data_parallel_rank(self.rank, self.world_size)
        if self._worker_slot is not None:  # a worker of shardtok's own loader
            worker, num_workers = self._worker_slot
        else:
            info = get_worker_info()
            worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return Placement(rank, world_size, worker, num_workers)

    def _start_stream(
        self, state: dict | MergedState | None
    ) -> tuple[PlacedStream, SlotRing | None]:
        """This process's stream, positioned at `state` (a stream state, a merged state, or
        None for the epoch's start)."""
        ring = None
        in_worker = self._worker_slot is not None or get_worker_info() is not None
        # In process nothing crosses a process boundary: batches are built in fresh arrays
        # (the allocator reuses the memory just freed; a slot cost ~3.5 µs more per batch).
        # Samples never go into a slot: the DataLoader's collate copies them into its batch.
        shared = self.shared_memory and not self.yields_samples
        if in_worker and shared and SlotRing.supported():
            if self._ring is None:  # one per process, kept across epochs
                self._ring = SlotRing(self.options.batch_size, self.options.seq_len)
            ring = self._ring
        placement = self._placement()
        info = get_worker_info()
        # Where the position lives now: in the workers (the main process's state_dict()
        # refuses) or here, in process (it is exact again).
        self._in_workers.value = int(in_worker)
        if self._worker_slot is None and info is not None:  # a torch DataLoader's worker
            check_worker_count(
                placement.num_workers, hint=self.num_workers, counted=self._len_workers,
                first_worker=info.id == 0,
            )  # fmt: skip
        count = self.num_batches
        stream = self.setup.stream(
            placement,
            epoch=self.epoch,
            resume=state,
            num_batches=None if count is None else per_worker(count, placement.num_workers),
            **({"allocate": ring.allocate} if ring is not None else {}),
        )
        self._stream = stream
        return stream, ring

    def __iter__(self):
        state, self._pending_state = self._pending_state, None
        stream, ring = self._start_stream(state)
        # In a worker, batches are built in reused slots of shared memory and only a handle
        # crosses the process boundary.
        local = get_worker_info() is None
        labels_format = self.options.labels_format
        try:
            if self.yields_samples:
                for batch in stream:
                    yield model_sample(to_tensors(batch), labels_format)
            elif ring is not None:
                for batch in stream:
                    yield ring.package(batch, labels_format=labels_format, local=local)
            else:
                for batch in stream:
                    yield model_batch(to_tensors(batch), labels_format)
        finally:  # an iterator left early: its shards and decode-ahead thread go now
            stream.close()

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This worker's position: the epoch, its stream state (None before iterating) and the
        fingerprint of the sources and options it belongs to.

        In the main process of a DataLoader whose workers stream this dataset it raises
        ResumeStateError: the position lives in the workers (checkpoint the loader)."""
        in_main = self._worker_slot is None and get_worker_info() is None
        # Workers streamed since this process last iterated or loaded a state: whatever this
        # process holds is behind them.
        if in_main and self._in_workers.value:
            raise ResumeStateError(_WORKERS_HOLD_STATE)
        # Before the first batch, a state loaded but not yet used is still the position.
        pending = self._pending_state
        if self._stream is None and isinstance(pending, MergedState):
            return pending.to_dict()
        stream = pending if self._stream is None else self._stream.state_dict()
        return self._state(stream, self._placement())  # type: ignore[arg-type]

    def _state(self, stream: dict | None, placement: Placement, epoch: int | None = None) -> dict:
        epoch = self.epoch if epoch is None else epoch
        return WorkerState(epoch, placement, stream, self.fingerprint).to_dict()

    def parse_state(self, state: dict, strict: bool | None = None) -> WorkerState | MergedState:
        """`state` checked, and checked against this dataset's sources and options (refused
        unless `strict` is False)."""
        return self.setup.check_saved(state, strict=self.strict if strict is None else strict)

    def load_state_dict(self, state: dict | list, strict: bool | None = None) -> None:
        """Continue from `state` at the next iteration: one worker's own state (same epoch,
        rank and worker; it may have another batch size), or the states of every old (rank,
        worker) -- a list of dataset states or of every rank's loader states, or their
        ``merge_states`` -- which continue with this dataset's world size, workers, batch size
        and sequence length by the remainder rule (docs/RESUME.md). A state of one process
        that streamed alone (world size 1, no workers) is every worker's state: it resumes
        another sequence length so too, without a list.

        A state saved for other sources or options is refused (ResumeStateError naming what
        differs) unless `strict` (default: the constructor's) is False; one of shardtok 0.1
        (without a version) is refused, naming that release."""
        saved = self.parse_state(loadable(state, self.options), strict)
        self.set_epoch(saved.epoch)
        if self._worker_slot is None and get_worker_info() is None:
            self._in_workers.value = 0  # the loaded state is the position now
        if isinstance(saved, MergedState):
            self.setup.check_resumes(saved)
            if saved.mixed and self.mix is None and self.curriculum is None:
                raise ResumeStateError("a merged state of a mix cannot resume a single dataset")
            self._pending_state = saved
        else:
            self._pending_state = saved.stream
        self._stream = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_ring"] = None  # each worker process maps its own
        state["_stream"] = None
        if get_spawning_popen() is None:  # a shared value only travels to a spawned child
            state["_epoch"] = int(self._epoch.value)
            state["_in_workers"] = int(self._in_workers.value)
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["_epoch"], int):
            state["_epoch"] = multiprocessing.RawValue("q", state["_epoch"])
        if isinstance(state.get("_in_workers", 0), int):
            state["_in_workers"] = multiprocessing.RawValue("b", state.get("_in_workers", 0))
        self.__dict__.update(state)

    # -- provenance -----------------------------------------------------------------------
    def trace(
        self, step: int, *, num_workers: int | None = None, state: dict | None = None
    ) -> dict:
        """Where rank `rank`'s batch at 1-based training step `step` comes from, as plain data:
        per sequence its segments (source, shard file, document index in the shard and in
        ``export-megatron``'s output, token range of the document, window positions) and padding.

        `num_workers`: the DataLoader's workers (0: in process; default: the constructor's
        `num_workers`, else the state's). `state`: a saved position to
        start from instead of the epoch's start (``ShardLoader.state_dict()``, this dataset's
        ``state_dict()``, or the CLI's state file document); its epoch is used. Recomputed from
        the plan and states alone (``shardtok.stream.provenance``): no token is read.

        The worker count decides which worker's batch a step is, so a trace never guesses it:
        without `num_workers`, the constructor's or a `state` it is a UsageError."""
        from shardtok.stream.provenance import trace_step
        from shardtok.stream.provenance.states import saved_rank

        rank, world_size = data_parallel_rank(self.rank, self.world_size)
        if num_workers is None:
            num_workers = self.num_workers
        epoch = self.epoch
        if state is not None:
            saved = saved_rank(state, self.setup)
            epoch = saved.epoch
            if num_workers is None:  # 0 and 1 give the same round robin
                num_workers = len(saved.workers)
        if num_workers is None:
            raise UsageError(
                "trace needs the DataLoader's worker count, which decides which worker's batch "
                "each step is: pass num_workers=K as in training (0: in process), give "
                "ShardStreamDataset(num_workers=K), or trace from a saved state"
            )
        return trace_step(
            self.setup, step=step, rank=rank, world_size=world_size, num_workers=num_workers,
            epoch=epoch, num_batches=self.num_batches, state=state,
        )  # fmt: skip


__all__ = ["ShardStreamDataset"]
