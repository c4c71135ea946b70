"""One (rank, worker)'s batches from a weighted mix of datasets: sources -> mixer -> batcher.

A mixed stream has no epoch end (each source restarts on its own), so it yields ``num_batches``
batches when given, else without end; every (rank, worker) can therefore yield the same count.
"""

from __future__ import annotations

from shardtok.stream import state as envelope
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.build import batcher_for, resolved
from shardtok.stream.mix.remainder import check_mix_layout, remainder_packers
from shardtok.stream.mix.sequences import MixedSequences
from shardtok.stream.mix.source import SourceSequences, with_source_seed
from shardtok.stream.mix.spec import MixSpec, load_mix_config
from shardtok.stream.nodes.base import PlacedStream
from shardtok.stream.options import StreamOptions


class MixedStream(PlacedStream):
    """The exact batches of one (rank, worker) from the weighted sources of `spec`.

    State (kind ``mixed_stream``): the placement and ``first_epoch``, the batcher's state (whose
    upstream is the ``mix_sequences`` state: the schedule step and every source's
    ``source_sequences`` state) and ``elastic``, the merged layout it finishes first (or null).
    """

    KIND = "mixed_stream"
    FIELDS = {
        **{k: envelope.INT for k in ("first_epoch", "rank", "world_size", "worker", "num_workers")},
        "batcher": envelope.STATE,
        "elastic": envelope.OPTIONAL_OBJECT,
    }
    state_name = "mixed stream"

    def __init__(
        self,
        spec: MixSpec,
        options: StreamOptions,
        *,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        num_batches: int | None = None,
        first_epoch: int = 0,
        elastic: dict | None = None,
        allocate: Allocator = allocate_arrays,
        source_ids: list[int] | None = None,
        streams: list[SourceSequences] | None = None,
    ):
        """`elastic`: a merged state's ``elastic_mix`` (another layout's saved positions); every
        source then first finishes its old epochs' remainder (see ``mix/remainder.py``).
        `source_ids`: the ids batches name the sources by (default: their index).
        `streams`: the sources' sequences, already positioned, to continue rather than start
        (curriculum stages that continue their sources); a fresh start leaves them where they
        are."""
        super().__init__()
        if elastic is not None:
            elastic = check_mix_layout(elastic, len(spec.sources), "mixed stream elastic state")
        self.elastic = elastic
        options = resolved(options, spec.sources)
        self.spec, self.options = spec, options
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.num_batches = num_batches
        self.first_epoch = first_epoch
        sources = list(streams or [])
        for i, source in enumerate([] if streams else spec.sources):
            source_options = with_source_seed(options, i)
            remainder, start = None, first_epoch
            if elastic is not None:
                remainder, start = remainder_packers(
                    source,
                    source_options,
                    elastic,
                    i,
                    new_index=rank * num_workers + worker,
                    new_slices=world_size * num_workers,
                )
            sources.append(
                SourceSequences(
                    source,
                    source_options,
                    rank=rank,
                    world_size=world_size,
                    worker=worker,
                    num_workers=num_workers,
                    first_epoch=start,
                    remainder=remainder,
                )
            )
        self.mixer = MixedSequences(sources, spec.weights, source_ids, carry=bool(streams))
        self.batcher = batcher_for(
            self.mixer, options, num_batches, allocate, f"mix rank {rank} worker {worker}"
        )

    @classmethod
    def from_config(cls, config, *, stage: str | int = 0, **kwargs) -> MixedStream:
        """Build from a YAML mix config (see ``mix.spec``); keyword options override it."""
        spec = load_mix_config(config, stage=stage)
        placement = {
            k: kwargs.pop(k)
            for k in ("rank", "world_size", "worker", "num_workers", "num_batches", "first_epoch")
            if k in kwargs
        }
        options = StreamOptions(**{**spec.options, **kwargs})
        return cls(spec, options, **placement)

    @property
    def identity(self) -> dict:
        return {
            "first_epoch": self.first_epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "worker": self.worker,
            "num_workers": self.num_workers,
        }

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an open-ended mixed stream has no length (give num_batches)")
        return self.num_batches

    def state_dict(self) -> dict:
        return self._wrap(**self.identity, batcher=self.batcher.state_dict(), elastic=self.elastic)

    def stats(self) -> dict:
        return {**self.batcher.stats(), "sources": self.mixer.shares()}
