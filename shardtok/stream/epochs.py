"""``EpochsStream``: one (rank, worker)'s batches of one dataset over consecutive epochs.

What `num_batches` means for a single dataset: epoch ``e0``, then ``e0 + 1``, ... each exactly
that epoch's ``SliceStream`` (so the first epoch is the stream without `num_batches`), until the
worker has yielded `num_batches` batches. Every worker of a rank yields as many batches in each
epoch (the epoch plan's ``batches_per_slice``), so a rank's steps move from one epoch to the
next together.

A part (epoch) switches lazily: after the last batch of epoch e the state stays in e until the
first batch of e + 1 is yielded. State (kind ``epochs_stream``): the placement (``epoch``: the
run's first epoch), ``first_step`` (the rank step this layout's stream began at: 0, or the
step of an elastic resume), ``batches`` (local, across epochs), ``current`` (the epoch the
state is in), ``slice`` (that epoch's ``slice_stream`` state, or null before its first batch)
and ``elastic`` (null, or the merged layout this stream resumed from: its first epoch is then
that layout's remainder, an ``ElasticStream``; see ``epochs_remainder.py``).
"""

from __future__ import annotations

from typing import Any

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.stream import epochs_remainder
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.build import resolved
from shardtok.stream.nodes.base import Located, PlacedStream
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.options import StreamOptions
from shardtok.stream.remainder import ElasticStream
from shardtok.stream.slice_stream import SliceStream

# Summed over finished epochs for stats(); the rest of a batcher's stats is recomputed.
_COUNTS = (
    "batches", "sequences", "real_tokens", "slots", "segments", "overlong_documents",
    "overlong_tokens_dropped",
)  # fmt: skip


class EpochsStream(PlacedStream):
    """`num_batches` batches of one (rank, worker), epoch after epoch (module docstring)."""

    KIND = epochs_remainder.KIND
    FIELDS = epochs_remainder.FIELDS
    OPTIONAL = epochs_remainder.OPTIONAL
    state_name = "epochs stream"
    resume_hint = (
        "restore with the same first epoch, rank, world size, worker and number of workers, or "
        "merge every (rank, worker)'s state with merge_states to continue with another layout"
    )

    def __init__(
        self,
        source: DatasetSource | str,
        options: StreamOptions,
        *,
        num_batches: int | None,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        first_step: int = 0,
        elastic: dict | None = None,
        allocate: Allocator = allocate_arrays,
    ):
        """`epoch`: the run's first epoch; `num_batches`: this worker's batches in all (from
        `first_step` on), None: to the end of the epoch it starts or resumes in (a state of
        this kind given to a stream without `num_batches`); `elastic`: a merged layout to
        resume from (its remainder first)."""
        super().__init__()
        if num_batches is not None and num_batches < 0:
            raise ValueError(f"num_batches must be >= 0, got {num_batches}")
        self.to_epoch_end = num_batches is None
        self.source = source if isinstance(source, DatasetSource) else DatasetSource.of(source)
        self.options = resolved(options, [self.source])
        self.num_batches = 0 if num_batches is None else num_batches
        self.epoch = epoch
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.first_step = first_step
        self.allocate = allocate
        self.elastic = elastic
        self.first_part, self._remainder = epoch, None
        if elastic is not None:
            elastic = epochs_remainder.check_epochs_layout(elastic, "epochs stream elastic state")
            self.first_part, self._remainder = epochs_remainder.remainder_of(
                self.source, self.options, elastic, epoch
            )
        self._lengths: dict[int, int] = {}
        self.current = self.first_part
        self.part: SliceStream | ElasticStream = self._part(self.current)
        self.batches = 0
        self._done = dict.fromkeys(_COUNTS, 0)  # stats of the epochs finished in this process
        if self.to_epoch_end:
            self.num_batches = len(self.part)

    def _part(self, epoch: int) -> SliceStream | ElasticStream:
        """Epoch `epoch`'s stream for this placement, fresh (not started: no I/O yet)."""
        where: dict[str, Any] = dict(
            rank=self.rank, world_size=self.world_size, worker=self.worker,
            num_workers=self.num_workers, allocate=self.allocate,
        )  # fmt: skip
        part: SliceStream | ElasticStream
        if self._remainder is not None and epoch == self.first_part:
            part = ElasticStream(self.source, self.options, self._remainder, epoch=epoch, **where)
        else:
            part = SliceStream(self.source, self.options, epoch=epoch, **where)
        self._lengths[epoch] = len(part)
        return part

    def _length(self, epoch: int) -> int:
        """This worker's batches in epoch `epoch` (every worker of the layout: the same)."""
        if epoch not in self._lengths:
            self._part(epoch)
        return self._lengths[epoch]

    @property
    def batcher(self) -> Batcher:  # type: ignore[override]
        """The current epoch's batcher (what a trace pulls rows from)."""
        return self.part.batcher  # type: ignore[return-value]

    def __len__(self) -> int:
        return self.num_batches

    # -- iteration and state --------------------------------------------------------------
    def _reset(self, state: dict | None) -> None:
        self._done = dict.fromkeys(_COUNTS, 0)
        if state is None:
            if self.current != self.first_part or self.part._started:
                self.current, self.part = self.first_part, self._part(self.first_part)
            self.batches = 0
            if self.to_epoch_end:
                self.num_batches = len(self.part)
            return
        state = self.parse_state(state)
        self._check_identity(state, first_step=self.first_step)
        if state["elastic"] != self.elastic:
            raise ResumeStateError(
                f"{self.state_name} state: field 'elastic' is another resume's than this stream's"
            )
        current, batches = state["current"], state["batches"]
        if not self.first_part <= current <= self.first_part + batches:
            raise ResumeStateError(
                f"{self.state_name} state: field 'current' is {current}, not an epoch this stream "
                f"reaches after {batches} batches from epoch {self.first_part}"
            )
        begin = state.get("begin")
        if begin is None:
            begin = sum(self._length(e) for e in range(self.first_part, current))
        part = self._part(current)
        if state["slice"] is not None:
            part.reset(state["slice"])
        if self.to_epoch_end:
            self.num_batches = begin + len(part)
        held = begin + part.batcher.batches  # type: ignore[attr-defined]
        if batches > self.num_batches or held != batches:
            raise ResumeStateError(
                f"{self.state_name} state: field 'batches' is {batches}, but its epochs hold "
                f"{held} (at most {self.num_batches})"
            )
        self.current, self.part, self.batches = current, part, batches

    def _next(self) -> dict:
        if self.batches >= self.num_batches:
            raise StopIteration
        try:
            batch = next(self.part)
        except StopIteration:  # the epoch is done: the next one begins with this batch
            self._finish_part()
            self.current += 1
            self.part = self._part(self.current)
            batch = next(self.part)
        self.batches += 1
        return batch

    def _finish_part(self) -> None:
        stats = self.batcher.stats()
        for key in _COUNTS:
            self._done[key] += stats.get(key, 0)

    def state_dict(self) -> dict:
        return self._wrap(
            **self.identity,
            first_step=self.first_step,
            batches=self.batches,
            current=self.current,
            slice=self.part.state_dict() if self.part._started else None,
            elastic=self.elastic,
            begin=self.batches - self.batcher.batches,
        )

    def stats(self) -> dict:
        """Packing statistics of the epochs streamed in this process (the current one from
        its restored counters on)."""
        now = self.batcher.stats()
        out = {**now, **{k: self._done[k] + now.get(k, 0) for k in _COUNTS if k in now}}
        out["packing_efficiency"] = out["real_tokens"] / out["slots"] if out["slots"] else 0.0
        return out

    def locate(self, local_batch: int) -> Located:
        """The epoch stream holding this worker's batch `local_batch` (part ``{"epoch": e}``):
        the current epoch's at its position, a later epoch's fresh."""
        if not self.batches <= local_batch < self.num_batches:
            raise ValueError(
                f"batch {local_batch} lies outside this stream's batches {self.batches}.."
                f"{self.num_batches - 1} from its position"
            )
        begin = self.batches - self.batcher.batches  # where the current epoch began
        epoch = self.current
        if local_batch < begin + len(self.part):
            return Located(self.part, local_batch - self.batches, {"epoch": epoch})
        begin += len(self.part)
        epoch += 1
        while local_batch >= begin + self._length(epoch):
            begin += self._length(epoch)
            epoch += 1
        return Located(self._part(epoch), local_batch - begin, {"epoch": epoch})
