"""``StagedStream``: one (rank, worker)'s batches through curriculum stages.

Worker ``w`` of ``K`` yields the rank's 0-based steps ``first_step + j * K + w`` (``j``: its
local batch number; ``first_step``: 0, or the rank step an elastic resume happened at), so stage
``k`` begins at its local batch ``Curriculum.local_begins(first_step, w, K)[k]`` and runs to the
next stage's begin (the last stage: to ``num_batches``). Stage k's batches come from a
``MixedStream`` of that stage's sources, weights and batch size; a stage with no batch for this
worker is skipped. With ``stage_switch: continue`` (the default) that mix is built over the
sources as the earlier stages left them: each source (``SourceSequences``, seeded by its number
in the curriculum's source table) continues from its cursor. With ``restart`` it is a fresh mix
of the stage's own seed, its sources at their beginning (Nanotron builds a new loader per stage).

The switch is lazy: after its last batch of stage k a worker still holds stage k's stream and
state, and builds stage k+1's only when it yields that stage's first batch. So a state's stage
is the stage of the last batch it yielded, which the fingerprint rule and ``merge_states`` use.

State (kind ``staged_stream``): the placement (``first_epoch``, ``rank``, ``world_size``,
``worker``, ``num_workers``), ``first_step``, ``batches`` (local batches yielded, all stages),
``stage`` (the current stage), ``mix`` (the current stage's ``mixed_stream`` state; null before
the first batch), ``elastic`` (null, or ``{"stage": p, "mix": layout}``: stage p finishes
another layout's saved positions first, see ``resume/elastic_stages.py``) and, when stages
continue their sources, ``sources``: per source of the curriculum's table, the
``source_sequences`` state of a source an earlier stage left (null: not read yet, or in the
current stage, whose state holds it). A state without ``sources`` is one of restarting stages.
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.batch import Allocator, allocate_arrays
from shardtok.stream.mix.cursors import SourceCursors
from shardtok.stream.mix.remainder import check_mix_layout
from shardtok.stream.mix.stages import Curriculum
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.base import Located, PlacedStream
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.options import StreamOptions
from shardtok.stream.rank import Placement, step_of

COUNTERS = ("real_tokens", "overlong_documents", "overlong_tokens_dropped")


class StagedStream(PlacedStream):
    """The exact batches of one (rank, worker) through the stages of `curriculum`."""

    KIND = "staged_stream"
    FIELDS = {
        **{
            k: envelope.INT
            for k in (
                "first_epoch",
                "rank",
                "world_size",
                "worker",
                "num_workers",
                "first_step",
                "batches",
                "stage",
            )
        },  # fmt: skip
        "mix": envelope.OPTIONAL_STATE,
        "elastic": envelope.OPTIONAL_OBJECT,
        "sources": envelope.LIST,  # only when stages continue their sources
    }
    OPTIONAL = ("sources",)
    state_name = "staged stream"
    resume_hint = (
        "restore with the same rank, world size, worker and number of workers, or merge every "
        "(rank, worker)'s state with merge_states to continue with another layout"
    )

    def __init__(
        self,
        curriculum: Curriculum,
        options: StreamOptions,
        *,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        num_batches: int | None = None,
        first_epoch: int = 0,
        first_step: int = 0,
        elastic: dict | None = None,
        allocate: Allocator = allocate_arrays,
    ):
        """`num_batches`: local batches of this worker over all stages (None: the last stage
        never ends). `first_step`/`elastic`: where a merged state resumes (the rank step and
        ``{"stage", "mix"}``); `options` are the shared ones (each stage applies its seed)."""
        super().__init__()
        self.curriculum, self.options = curriculum, options
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.num_batches, self.first_epoch, self.first_step = num_batches, first_epoch, first_step
        self.allocate = allocate
        self.begins = curriculum.local_begins(first_step, worker, num_workers)
        self.continues = curriculum.continues
        self.elastic = None if elastic is None else self._check_elastic(elastic)
        self.stage = self.stage_of(0)
        self.batches = 0
        self._mix: MixedStream | None = None
        self._left = dict.fromkeys(COUNTERS, 0)  # stages finished in this process
        # Stages that continue their sources: every source's cursor, across stage switches.
        self.cursors: SourceCursors | None = None
        if self.continues:
            layout = None if self.elastic is None else self.elastic["mix"]
            self.cursors = SourceCursors(
                curriculum, options, Placement(rank, world_size, worker, num_workers),
                first_epoch=first_epoch, layout=layout,
            )  # fmt: skip

    def _check_elastic(self, elastic: object) -> dict:
        if not isinstance(elastic, dict) or set(elastic) != {"stage", "mix"}:
            raise ResumeStateError("staged stream elastic state: expected {'stage', 'mix'}")
        stage = elastic["stage"]
        if self.continues and elastic["mix"] is not None:
            check_mix_layout(elastic["mix"], len(self.curriculum.sources), "staged stream elastic")
        mine = self.curriculum.stage_of_step(self.first_step + 1)
        if stage != mine:
            raise ResumeStateError(
                f"the merged state continues stage {stage!r} at step {self.first_step + 1}, but "
                f"this curriculum puts that step in stage {mine} "
                f"({self.curriculum.stages[mine].name!r})"
            )
        return elastic

    # -- where each stage lies in this worker's batches ----------------------------------
    def stage_of(self, local_batch: int) -> int:
        """The stage of this worker's local batch `local_batch`."""
        return max(k for k, begin in enumerate(self.begins) if begin <= local_batch)

    def end_of(self, stage: int) -> int | None:
        """The local batch at which `stage` ends (None: never)."""
        ends = [*self.begins[1:], self.num_batches]
        end = ends[stage]
        if end is None or self.num_batches is None:
            return end
        return min(end, self.num_batches)

    def part(self, stage: int) -> MixedStream:
        """Stage `stage`'s stream for this worker, fresh (not positioned)."""
        end = self.end_of(stage)
        begin = self.begins[stage] if end is None else min(self.begins[stage], end)
        elastic = self.elastic
        return MixedStream(
            self.curriculum.stages[stage].mix,
            self.curriculum.options_for(stage, self.options),
            rank=self.rank,
            world_size=self.world_size,
            worker=self.worker,
            num_workers=self.num_workers,
            num_batches=None if end is None else end - begin,
            first_epoch=self.first_epoch,
            elastic=(
                elastic["mix"]
                if elastic is not None and elastic["stage"] == stage and not self.continues
                else None
            ),
            allocate=self.allocate,
            source_ids=self.curriculum.source_ids(stage),
            streams=None if self.cursors is None else self.cursors.streams(stage),
        )

    # -- the node contract -----------------------------------------------------------------
    @property
    def identity(self) -> dict:
        return {
            "first_epoch": self.first_epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "worker": self.worker,
            "num_workers": self.num_workers,
        }

    def _reset(self, state: dict | None) -> None:
        self._left = dict.fromkeys(COUNTERS, 0)
        if self.cursors is not None:
            self.cursors.parked = {}
        if state is None:
            self.batches, self.stage, self._mix = 0, self.stage_of(0), None
            return
        s = self.parse_state(state)
        self._check_identity(s)
        self._check_rule(s)
        if self.cursors is not None:
            self.cursors.restore(s["sources"], s["stage"], s["mix"] is not None)
        if (s["first_step"], s["elastic"]) != (self.first_step, self.elastic):
            raise ResumeStateError(
                f"staged_stream state: it began at step {s['first_step']} (elastic: "
                f"{s['elastic'] is not None}), this stream at step {self.first_step} (elastic: "
                f"{self.elastic is not None}); build the stream from the state "
                "(StreamSetup.stream)"
            )
        limit = float("inf") if self.num_batches is None else self.num_batches
        batches = envelope.check_range(self.KIND, "batches", s["batches"], 0, limit)
        stage = envelope.check_range(self.KIND, "stage", s["stage"], 0, len(self.begins) - 1)
        if s["mix"] is None:
            if stage != self.stage_of(batches) or batches != self.begins[stage]:
                raise ResumeStateError(
                    f"staged_stream state: stage {stage} without its stream's state must be at "
                    f"that stage's first batch, not at local batch {batches}"
                )
            self._mix = None
        else:
            mix = self.part(stage)
            mix.reset(s["mix"])
            done = self.begins[stage] + mix.batcher.batches
            if done != batches:
                raise ResumeStateError(
                    f"staged_stream state: field 'batches' is {batches}, but stage {stage}'s "
                    f"stream has yielded {mix.batcher.batches} batches from local batch "
                    f"{self.begins[stage]} on"
                )
            self._mix = mix
        self.batches, self.stage = batches, stage

    def _check_rule(self, s: dict) -> None:
        """A parsed state must be of this stream's stage switch rule."""
        if ("sources" in s) != self.continues:
            saved, now = ("continue", "restart") if "sources" in s else ("restart", "continue")
            raise ResumeStateError(
                f"staged_stream state: saved by stages that {saved} their sources at a switch, "
                f"this stream's stages {now} them (stage_switch: {saved} resumes it)"
            )

    def _next(self) -> dict:
        if self.num_batches is not None and self.batches >= self.num_batches:
            raise StopIteration
        end = self.end_of(self.stage)
        if self._mix is None or (end is not None and self.batches >= end):
            self._enter(self.stage_of(self.batches))
        assert self._mix is not None
        batch = next(self._mix)
        self.batches += 1
        return batch

    def _enter(self, stage: int) -> None:
        """Leave the current stage for `stage`'s stream (the lazy switch); sources that
        continue are parked at their positions and let go of what they read with."""
        if self._mix is not None:
            totals = self._totals(self._mix)
            for key in COUNTERS:
                self._left[key] += totals[key]
            if self.cursors is not None:
                self.cursors.park(self.stage, self._mix.mixer.sources)
        self._mix = self.part(stage)
        if self.cursors is not None:
            self.cursors.take(stage)
        self._mix.reset(None)
        self.stage = stage

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        parked = {} if self.cursors is None else {"sources": self.cursors.state()}
        return self._wrap(
            **self.identity,
            first_step=self.first_step,
            batches=self.batches,
            stage=self.stage,
            mix=None if self._mix is None else self._mix.state_dict(),
            elastic=self.elastic,
            **parked,
        )

    @classmethod
    def position(cls, state: dict) -> tuple[int, int]:
        """(stage, step) of a staged_stream `state`: its current stage and the 1-based training
        step of the last batch it yielded (``first_step`` when it yielded none)."""
        s = cls.parse_state(state)
        if s["batches"] == 0:
            return s["stage"], s["first_step"]
        last = step_of(s["worker"], s["batches"] - 1, s["first_step"], s["num_workers"])
        return s["stage"], last + 1

    @classmethod
    def from_mix_state(cls, state: dict, curriculum: Curriculum | None = None) -> dict:
        """A mix's ``mixed_stream`` state (a run of a one-stage config) as the state of stage 0
        of `curriculum`, whose stage 0 is that mix: it began at step 0 and its batches are the
        mix's (stages that continue their sources seed them as the mix did). Refused for a mix
        resumed elastically (its states do not record the step)."""
        s = MixedStream.parse_state(state)
        if s["elastic"] is not None:
            raise ResumeStateError(
                "a state of a mix resumed elastically cannot resume curriculum stages: its "
                "streams do not record the step of the resume"
            )
        return envelope.wrap(
            cls.KIND,
            {
                "first_epoch": s["first_epoch"],
                **{k: s[k] for k in ("rank", "world_size", "worker", "num_workers")},
                "first_step": 0,
                "batches": Batcher.parse_state(s["batcher"])["batches"],
                "stage": 0,
                "mix": state,
                "elastic": None,
                **(
                    {"sources": [None] * len(curriculum.sources)}
                    if curriculum is not None and curriculum.continues
                    else {}
                ),
            },
        )

    def locate(self, local_batch: int) -> Located:
        """The stage stream that yields local batch `local_batch` (``part={"stage": k}``): the
        current stage's live stream when the batch lies in it, else a fresh one at its start.
        Stages that continue their sources first pass over the batches before that stage's
        start (their sources' positions there depend on every one of them)."""
        if local_batch < self.batches:
            raise ValueError(
                f"batch {local_batch} lies before this stream's position ({self.batches})"
            )
        if self.num_batches is not None and local_batch >= self.num_batches:
            raise ValueError(
                f"batch {local_batch} lies past this stream's end ({self.num_batches})"
            )
        if not self._started:
            self.reset(None)
        stage = self.stage_of(local_batch)
        if self.continues:
            self._pass_to(stage)
        if stage == self.stage and self._mix is not None:
            found = self._mix.locate(local_batch - self.begins[stage])
            return Located(found.stream, found.skip, {"stage": stage})
        fresh = self.part(stage)
        fresh.reset(None)
        return Located(fresh, local_batch - self.begins[stage], {"stage": stage})

    def _pass_to(self, stage: int) -> None:
        """Pass over this worker's batches up to the start of `stage`, without building them
        where the sources pack concat windows (``MixedSequences.pass_rows``)."""
        while self.stage_of(self.batches) < stage:
            current = self.stage_of(self.batches)
            if self._mix is None or self.stage != current:
                self._enter(current)
            assert self._mix is not None
            count = self.begins[current + 1] - self.batches
            if self._mix.mixer.passes_in_runs:
                self._mix.mixer.pass_rows(count * self._mix.options.batch_size)
                self._mix.batcher.batches += count
                self.batches += count
            else:
                for _ in range(count):
                    next(self)
        if self.stage_of(self.batches) == stage and (self._mix is None or self.stage != stage):
            self._enter(stage)

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an open-ended staged stream has no length (give num_batches)")
        return self.num_batches

    # -- statistics --------------------------------------------------------------------------
    def stats(self) -> dict:
        """The current stage's statistics (as ``MixedStream.stats``): its batcher's counters
        and per source (``source_id``: the curriculum-wide id) sequences, share and epoch."""
        mix = self._mix if self._mix is not None else self.part(self.stage)
        ids = self.curriculum.source_ids(self.stage)
        rows = [{**row, "source_id": i} for row, i in zip(mix.stats()["sources"], ids)]
        stage = {"stage": self.stage, "stage_name": self.curriculum.stages[self.stage].name}
        return {**mix.batcher.stats(), **stage, "sources": rows}

    def totals(self) -> dict:
        """Real tokens packed and overlong documents met (with the tokens they lost) over every
        stage this process streamed."""
        current = self._totals(self._mix) if self._mix is not None else {}
        return {k: self._left[k] + current.get(k, 0) for k in COUNTERS}

    @staticmethod
    def _totals(mix: MixedStream) -> dict:
        rows = mix.stats()["sources"]
        return {
            "real_tokens": mix.batcher.stats()["real_tokens"],
            "overlong_documents": sum(r["overlong_documents"] for r in rows),
            "overlong_tokens_dropped": sum(r["overlong_tokens_dropped"] for r in rows),
        }
