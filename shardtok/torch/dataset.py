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

from shardtok.errors import ResumeStateError, ShardtokError
from shardtok.storage.dataset import DatasetSource
from shardtok.stream.build import plan_for
from shardtok.stream.mix.spec import MixSpec, load_mix_config, mix_spec
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.base import Node
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan
from shardtok.stream.resume.elastic import ElasticStream
from shardtok.stream.resume.fingerprint import check_fingerprint, stream_fingerprint
from shardtok.stream.slice_stream import SliceStream
from shardtok.torch.distributed import data_parallel_rank
from shardtok.torch.loader.transport import SlotRing, to_tensors


class ShardStreamDataset(IterableDataset):
    """Packed batches (dicts of tensors) from a shardtok dataset; see ``StreamOptions``.

    ``rank``/``world_size`` default to torch.distributed's when it is initialised. ``set_epoch``
    reaches workers even when they are persistent (the epoch lives in shared memory).
    ``state_dict()``/``load_state_dict()`` hold one worker's stream state: a DataLoader-aware
    checkpointer (torchdata's StatefulDataLoader) calls them inside each worker.

    `dataset` is one dataset (a path or URL: an epoch of it, ``plan().batches_per_rank``
    batches), or a weighted mix: a ``{path: weight}`` mapping, a list of paths (weights
    proportional to size) or a ``MixSpec``; a mix yields `num_batches` batches per rank (rounded
    up to a multiple of the number of workers) from an endless schedule over source epochs.
    Saved states carry a fingerprint of the sources and options; `strict=False` resumes even
    when it differs.
    """

    def __init__(
        self,
        dataset: str | Path | DatasetSource | dict | list | MixSpec,
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
        num_batches: int | None = None,
        strict: bool = True,
    ):
        super().__init__()
        self.mix: MixSpec | None = None
        if isinstance(dataset, MixSpec):
            self.mix = dataset
        elif isinstance(dataset, (dict, list, tuple)):
            self.mix = mix_spec(dataset, storage_options)
        if self.mix is not None:
            if num_batches is None or num_batches < 1:
                raise ShardtokError("a mixed dataset needs num_batches (batches per rank) >= 1")
            self.sources = list(self.mix.sources)
        else:
            source = dataset if isinstance(dataset, DatasetSource) else None
            self.sources = [source or DatasetSource(dataset, storage_options)]  # type: ignore[arg-type]
        self.source = self.sources[0]
        self.num_batches = num_batches
        self.strict = strict
        self._fingerprint: dict | None = None
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
        self._stream: Node[dict] | None = None
        self._pending_state: dict | None = None
        self._ring: SlotRing | None = None
        self._worker_slot: tuple[int, int] | None = None  # (worker, num_workers) in a ShardLoader

    @classmethod
    def from_config(cls, config: str | Path | dict, *, stage: str | int = 0, **kwargs):
        """A dataset from a YAML mix config (Nanotron style); keyword arguments override it."""
        spec = load_mix_config(
            config, stage=stage, storage_options=kwargs.pop("storage_options", None)
        )
        return cls(spec, **{**spec.options, **kwargs})

    @property
    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            weights = self.mix.weights if self.mix is not None else None
            self._fingerprint = stream_fingerprint(self.sources, weights, self.options)
        return self._fingerprint

    # -- epochs and plans -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def plan(self, num_workers: int = 1, epoch: int | None = None) -> EpochPlan:
        """The epoch plan for a DataLoader with `num_workers` workers (0 counts as 1)."""
        if self.mix is not None:
            raise ShardtokError("a mixed dataset has no single epoch plan (see num_batches)")
        _, world_size = data_parallel_rank(self.rank, self.world_size)
        return plan_for(
            self.source,
            self.options,
            epoch=self.epoch if epoch is None else epoch,
            world_size=world_size,
            num_workers=max(num_workers, 1),
        )

    def batches_per_rank(self, num_workers: int = 1) -> int:
        if self.mix is not None:
            return self._mix_batches_per_worker(max(num_workers, 1)) * max(num_workers, 1)
        return self.plan(num_workers).batches_per_rank

    def _mix_batches_per_worker(self, num_workers: int) -> int:
        assert self.num_batches is not None
        return -(-self.num_batches // num_workers)

    # -- iteration ------------------------------------------------------------------------
    def _placement(self) -> dict[str, int]:
        rank, world_size = data_parallel_rank(self.rank, self.world_size)
        if self._worker_slot is not None:  # a worker of shardtok's own loader
            worker, num_workers = self._worker_slot
        else:
            info = get_worker_info()
            worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return dict(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)

    def _make_stream(self, state: dict | None) -> tuple[Node[dict], SlotRing | None]:
        ring = None
        if self.shared_memory and SlotRing.supported():
            if self._ring is None:  # one per process, kept across epochs
                self._ring = SlotRing(self.options.batch_size, self.options.seq_len)
            ring = self._ring
        allocate: dict[str, Any] = {"allocate": ring.allocate} if ring is not None else {}
        placement: dict[str, Any] = dict(self._placement())
        num_workers = placement["num_workers"]
        stream: Node[dict]
        if self.mix is not None:
            elastic_mix = None if state is None else state.get("elastic_mix", state.get("elastic"))
            stream = MixedStream(
                self.mix,
                self.options,
                num_batches=self._mix_batches_per_worker(num_workers),
                first_epoch=self.epoch,
                elastic=elastic_mix,
                **placement,
                **allocate,
            )
        elif state is not None and "elastic" in state:  # the rest of an epoch of another layout
            stream = ElasticStream(
                self.source, self.options, state["elastic"], epoch=self.epoch, **placement,
                **allocate,
            )  # fmt: skip
        else:
            stream = SliceStream(
                self.source, self.options, epoch=self.epoch, **placement, **allocate
            )
        return stream, ring

    def _start_stream(self, state: dict | None) -> tuple[Node[dict], SlotRing | None]:
        """This process's stream, positioned at `state` (a stream state, a merged state, or
        None for the epoch's start)."""
        stream, ring = self._make_stream(state)
        if state is not None and (
            "elastic_mix" in state
            or ("elastic" in state and "remainder" not in state and "batcher" not in state)
        ):
            state = None  # a merged state: this new slice starts at its beginning
        stream.reset(state)
        self._stream = stream
        return stream, ring

    def __iter__(self):
        state, self._pending_state = self._pending_state, None
        stream, ring = self._start_stream(state)
        # Batches are built in reused slots (no page faults for fresh memory); across a process
        # boundary only a handle is pickled.
        local = get_worker_info() is None
        for batch in stream:
            yield ring.package(batch, local=local) if ring is not None else to_tensors(batch)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This worker's position: the epoch, its stream state (None before iterating) and the
        fingerprint of the sources and options it belongs to."""
        # Before the first batch, a state loaded but not yet used is still the position.
        stream = self._pending_state if self._stream is None else self._stream.state_dict()
        return self._state(stream, self._placement())

    def _state(
        self, stream: dict | None, placement: dict[str, int], epoch: int | None = None
    ) -> dict:
        return {
            "epoch": self.epoch if epoch is None else epoch,
            "placement": placement,
            "stream": stream,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict, strict: bool | None = None) -> None:
        """Continue from `state` at the next iteration: one worker's own state (same epoch,
        rank and worker), or a ``merge_states([...])`` of every old (rank, worker)'s state, which
        finishes that epoch with this dataset's world size and DataLoader workers.

        A state saved for other sources or options is refused (ResumeStateError naming what
        differs) unless `strict` (default: the constructor's) is False."""
        check_fingerprint(
            state.get("fingerprint"),
            self.fingerprint,
            strict=self.strict if strict is None else strict,
        )
        self.set_epoch(int(state["epoch"]))
        if "elastic" in state:  # from merge_states: every new (rank, worker) takes its share
            self._pending_state = {"elastic": state["elastic"]}
        elif "elastic_mix" in state:  # the same, for a weighted mix
            if self.mix is None:
                raise ResumeStateError("a merged state of a mix cannot resume a single dataset")
            self._pending_state = {"elastic_mix": state["elastic_mix"]}
        else:
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
