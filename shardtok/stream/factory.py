"""The one place that decides which stream a (rank, worker) runs, for a start or a saved state.

``StreamSetup`` is what a job streams: one dataset or a weighted mix, and the options. Its
``stream(placement, epoch=..., resume=...)`` returns the placed stream, already positioned:

=====================================  ================================================
resume                                 stream
=====================================  ================================================
None                                   ``SliceStream`` (a dataset) / ``MixedStream`` (a mix);
                                       a dataset with `num_batches`: ``EpochsStream``
a ``slice_stream`` state               ``SliceStream`` restored to it
a ``mixed_stream`` state               ``MixedStream`` (with its elastic layout) restored to it
an ``elastic_stream`` state            ``ElasticStream`` restored to it
an ``epochs_stream`` state             ``EpochsStream`` restored to it (needs `num_batches`)
a ``MergedState``                      ``ElasticStream`` / elastic ``MixedStream`` at its start;
                                       with `num_batches`: ``EpochsStream`` from its remainder
=====================================  ================================================

Curriculum stages (``staged``, two or more stages) stream a ``StagedStream``: fresh, restored to
a ``staged_stream`` state, or from a ``merged_stages`` state at its step. A one-stage config is
a plain mix (``StreamSetup.mixed(curriculum.stage_spec(0), ...)``), with a mix's states.

The torch adapter, the fast loader's workers and the CLI all build their streams here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.storage.retry import RetryPolicy
from shardtok.stream import state as envelope
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.build import plan_for, resolved
from shardtok.stream.epochs import EpochsStream
from shardtok.stream.epochs_remainder import is_epochs_layout
from shardtok.stream.mix.sequences import MixedSequences
from shardtok.stream.mix.source import SourceSequences
from shardtok.stream.mix.spec import MixSpec, check_tokenizers
from shardtok.stream.mix.stages import Curriculum
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes import (
    ArrayDocuments,
    Batcher,
    BFDPacker,
    ConcatPacker,
    GreedyPacker,
    ShuffleBuffer,
    SliceReader,
)
from shardtok.stream.nodes.base import PlacedStream
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan
from shardtok.stream.remainder import ElasticStream, RemainderDocuments
from shardtok.stream.resume.fingerprint import (
    RESUME_ANYWAY,
    check_fingerprint,
    staged_fingerprint,
    stream_fingerprint,
)
from shardtok.stream.resume.saved import (
    MergedState,
    Placement,
    WorkerState,
    parse_saved,
    saved_position,
)
from shardtok.stream.slice_stream import SliceStream
from shardtok.stream.staged import StagedStream

STREAM_KINDS = (
    "slice_stream", "elastic_stream", "mixed_stream", "staged_stream", "epochs_stream"
)  # fmt: skip
# Every kind a stream state may hold, with the class that owns its fields.
NODE_CLASSES = {
    cls.KIND: cls
    for cls in (
        SliceStream, ElasticStream, MixedStream, StagedStream, EpochsStream, Batcher,
        ConcatPacker, GreedyPacker, BFDPacker, ShuffleBuffer, SliceReader, ArrayDocuments,
        RemainderDocuments, SourceSequences, MixedSequences,
    )
}  # fmt: skip


def use_retry(data: DatasetSource | MixSpec | Curriculum, retry: RetryPolicy | None) -> None:
    """Make every source of `data` (one dataset, a mix, or every stage's mix) read with
    `retry`; None leaves each source its own. Call it before anything is read: a source's
    shard reader keeps the policy it was built with."""
    if retry is None:
        return
    if isinstance(data, DatasetSource):
        sources = [data]
    elif isinstance(data, MixSpec):
        sources = list(data.sources)
    else:  # every stage's own objects: two stages may hold equal sources as two objects
        sources = [source for stage in data.stages for source in stage.mix.sources]
    for source in sources:
        source.retry = retry


def check_stream_state(state: object) -> dict:
    """Every level of a stream state checked against its own kind's fields, in the process that
    loads it (a worker restores its stream later; a damaged state must not wait for that)."""
    owner = NODE_CLASSES[_kind(state)]
    state = envelope.parse(state, STREAM_KINDS, owner.FIELDS, owner.OPTIONAL)
    _check_levels(state)
    return state


def _kind(state: object) -> str:
    kind = state.get("kind") if isinstance(state, dict) else None
    return kind if kind in STREAM_KINDS else STREAM_KINDS[0]


def _check_levels(value: object) -> None:
    if isinstance(value, dict):
        if envelope.is_enveloped(value):
            kind = value.get("kind")
            if not isinstance(kind, str) or kind not in NODE_CLASSES:
                raise ResumeStateError(f"a stream state holds a state of unknown kind {kind!r}")
            NODE_CLASSES[kind].parse_state(value)
        for item in value.values():
            _check_levels(item)
    elif isinstance(value, list):
        for item in value:
            _check_levels(item)


@dataclass
class StreamSetup:
    """One dataset (``mix`` None), a weighted mix, or curriculum stages (``curriculum``, whose
    sources are numbered across stages), streamed with ``options``."""

    sources: Sequence[DatasetSource]
    options: StreamOptions
    mix: MixSpec | None = None
    curriculum: Curriculum | None = None
    _fingerprint: dict | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # What the data decides (packing, overlong) is fixed here, so fingerprints, plans and
        # merged layouts all see the options the stream really runs with.
        self.options = resolved(self.options, self.sources)

    @classmethod
    def single(cls, source: DatasetSource, options: StreamOptions) -> StreamSetup:
        return cls([source], options)

    @classmethod
    def mixed(cls, spec: MixSpec, options: StreamOptions) -> StreamSetup:
        """A mix; sources tokenized differently are refused (``check_tokenizers``)."""
        check_tokenizers(spec)
        return cls(list(spec.sources), options, spec)

    @classmethod
    def staged(cls, curriculum: Curriculum, options: StreamOptions) -> StreamSetup:
        """Curriculum stages (two or more; one stage is a plain mix, see the module docstring)
        with the shared `options`; sources tokenized differently across all stages are
        refused (``Curriculum.check_tokenizers``)."""
        if len(curriculum.stages) < 2:
            raise ValueError(
                "one stage streams as a mix: StreamSetup.mixed(curriculum.stage_spec(0), ...)"
            )
        curriculum.check_tokenizers()
        curriculum.check_seeds(options)
        return cls(curriculum.sources, options, None, curriculum)

    @classmethod
    def of(cls, data: DatasetSource | MixSpec | Curriculum, options: StreamOptions) -> StreamSetup:
        """One dataset, a mix, or curriculum stages (one stage: its mix, with its seed)."""
        if isinstance(data, Curriculum):
            if len(data.stages) == 1:
                return cls.mixed(data.stages[0].mix, data.options_for(0, options))
            return cls.staged(data, options)
        if isinstance(data, MixSpec):
            return cls.mixed(data, options)
        return cls.single(data, options)

    def check_saved(
        self, state: object, *, strict: bool = True, advice: str = RESUME_ANYWAY
    ) -> WorkerState | MergedState:
        """`state`, a dataset worker state or a merged state, checked level by level and
        against this setup's fingerprint: refused (ResumeStateError) when saved for other data
        or options, unless not `strict` (curriculum stages: by where the state is,
        ``check_fingerprint``)."""
        saved = parse_saved(state)
        if isinstance(saved, WorkerState) and saved.stream is not None:
            check_stream_state(saved.stream)
        where = saved if isinstance(saved, MergedState) else saved.stream
        check_fingerprint(saved.fingerprint, self.fingerprint, strict=strict, advice=advice,
                          merged=isinstance(saved, MergedState), **saved_position(where))  # fmt: skip
        return saved

    def check_resumes(self, resume: dict | MergedState | None) -> None:
        """Refuse (one line) a stream or merged state of stages for a dataset or mix, and the
        other way round."""
        if resume is None:
            return
        if isinstance(resume, MergedState):
            staged = resume.stage is not None
        else:
            staged = resume.get("kind") == StagedStream.KIND
        if staged and self.curriculum is None:
            raise ResumeStateError(
                "a state of curriculum stages cannot resume one dataset or mix (give the whole "
                "config, not one --stage)"
            )
        if isinstance(resume, dict) and resume.get("kind") == MixedStream.KIND:
            return  # a mix's own state: stage 0 of stages (StagedStream.from_mix_state)
        if not staged and self.curriculum is not None:
            raise ResumeStateError(
                "a state of one dataset, or a merged state of a mix, cannot resume curriculum "
                "stages"
            )

    def map_sources(self, change: Callable[[DatasetSource], DatasetSource]) -> StreamSetup:
        """This setup with every source replaced by `change(source)` (each distinct source
        changed once, so a curriculum's stages still share theirs): what a provenance trace
        streams, with sources whose documents are token addresses."""
        changed: dict[int, DatasetSource] = {}

        def one(source: DatasetSource) -> DatasetSource:
            if id(source) not in changed:
                changed[id(source)] = change(source)
            return changed[id(source)]

        def mix(spec: MixSpec) -> MixSpec:
            return replace(spec, sources=[one(s) for s in spec.sources])

        curriculum = None
        if self.curriculum is not None:
            stages = [replace(s, mix=mix(s.mix)) for s in self.curriculum.stages]
            curriculum = replace(self.curriculum, stages=stages)
        return StreamSetup(
            [one(s) for s in self.sources],
            self.options,
            None if self.mix is None else mix(self.mix),
            curriculum,
            self._fingerprint,
        )

    @property
    def fingerprint(self) -> dict:
        if self._fingerprint is None and self.curriculum is not None:
            self._fingerprint = staged_fingerprint(self.curriculum, self.options)
        if self._fingerprint is None:
            weights = self.mix.weights if self.mix is not None else None
            self._fingerprint = stream_fingerprint(self.sources, weights, self.options)
        return self._fingerprint

    def plan(self, *, epoch: int, world_size: int, num_workers: int) -> EpochPlan:
        """The epoch plan of a single dataset."""
        return plan_for(
            self.sources[0], self.options, epoch=epoch, world_size=world_size,
            num_workers=num_workers,
        )  # fmt: skip

    def stream(
        self,
        placement: Placement,
        *,
        epoch: int,
        resume: dict | MergedState | None = None,
        num_batches: int | None = None,
        allocate: Allocator = allocate_arrays,
    ) -> PlacedStream:
        """The stream of `placement`, positioned at `resume` (see the module docstring).

        `num_batches`: batches per worker of a mix or stages (they have no epoch end), or of a
        single dataset over consecutive epochs (``EpochsStream``)."""
        where = dict(
            rank=placement.rank,
            world_size=placement.world_size,
            worker=placement.worker,
            num_workers=placement.num_workers,
        )
        merged = resume if isinstance(resume, MergedState) else None
        state = resume if isinstance(resume, dict) else None
        kind = None if state is None else state.get("kind")
        if state is not None and kind not in STREAM_KINDS:
            raise ResumeStateError(
                f"expected a stream state ({', '.join(STREAM_KINDS)}), got a {kind!r} state"
            )
        self.check_resumes(resume)
        stream: PlacedStream
        if self.curriculum is not None:
            first_step, elastic = 0, None
            if merged is not None:
                first_step = merged.step
                if merged.layout is not None:
                    elastic = {"stage": merged.stage, "mix": merged.layout}
            elif state is not None:
                if kind == MixedStream.KIND:  # a run of one stage, grown into several
                    state = StagedStream.from_mix_state(state, self.curriculum)
                parsed = StagedStream.parse_state(state)
                first_step, elastic = parsed["first_step"], parsed["elastic"]
            stream = StagedStream(
                self.curriculum, self.options, num_batches=num_batches, first_epoch=epoch,
                first_step=first_step, elastic=elastic, allocate=allocate, **where,
            )  # fmt: skip
        elif self.mix is not None:
            if kind in ("slice_stream", "elastic_stream") or (merged and not merged.mixed):
                raise ResumeStateError("a state of a single dataset cannot resume a mix")
            elastic = merged.layout if merged is not None else None
            if state is not None:
                elastic = MixedStream.parse_state(state)["elastic"]
            stream = MixedStream(
                self.mix, self.options, num_batches=num_batches, first_epoch=epoch,
                elastic=elastic, allocate=allocate, **where,
            )  # fmt: skip
        elif kind == "mixed_stream" or (merged is not None and merged.mixed):
            raise ResumeStateError("a state of a mix cannot resume a single dataset")
        elif (
            kind == "epochs_stream"
            or (num_batches is not None and kind is None)
            or (merged is not None and is_epochs_layout(merged.layout))
        ):
            stream = self._epochs(epoch, state, merged, num_batches, allocate, where)
        elif merged is not None or kind == "elastic_stream":
            if merged is not None:
                layout = merged.layout
            else:
                layout = ElasticStream.parse_state(state)["elastic"]
            stream = ElasticStream(
                self.sources[0], self.options, layout, epoch=epoch, allocate=allocate, **where
            )
        else:
            stream = SliceStream(
                self.sources[0], self.options, epoch=epoch, allocate=allocate, **where
            )
        stream.reset(state)  # a merged state: every new slice starts at its beginning
        return stream

    def _epochs(self, epoch, state, merged, num_batches, allocate, where) -> EpochsStream:
        """A single dataset's `num_batches` over consecutive epochs, fresh, at its own state,
        or continuing a merged state (an ``epochs_stream``'s, or one epoch's: its remainder
        first); without `num_batches`, the state's stream to the end of the epoch it is in. A
        ``slice_stream`` state still resumes as the one epoch it was saved in."""
        first_step, elastic = 0, None
        if state is not None:
            saved = EpochsStream.parse_state(state)
            first_step, elastic = saved["first_step"], saved["elastic"]
        elif merged is not None:
            elastic = merged.layout
            first_step = merged.layout.get("step", 0)
        return EpochsStream(
            self.sources[0], self.options, num_batches=num_batches, epoch=epoch,
            first_step=first_step, elastic=elastic, allocate=allocate, **where,
        )  # fmt: skip
