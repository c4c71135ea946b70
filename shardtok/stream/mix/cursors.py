"""``SourceCursors``: the cursors of a curriculum's sources for one (rank, worker), kept across
stage switches (``stage_switch: continue``).

A stage's mix draws from ``streams(stage)``: each of its sources where the earlier stages left
it. A source a stage does not read is parked: its ``source_sequences`` state is kept (and saved)
and it holds no shard open; the next stage that reads it restores it from there. Each source has
one seed for the whole run, the shared seed and its number in the curriculum's table, so a
curriculum's first stage draws what a plain mix of its sources does. After an elastic resume
(``layout``: every source's merged positions) each source first finishes what the old layout
left of its epochs, whichever stage reads it next. A stage with its own ``seq_len`` packs its
sources with it: each finishes the phase it was in (the rest of its epoch) in the new window.
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError
from shardtok.stream.build import resolved
from shardtok.stream.mix.remainder import remainder_packers
from shardtok.stream.mix.source import SourceSequences, with_source_seed
from shardtok.stream.mix.stages import Curriculum
from shardtok.stream.options import StreamOptions
from shardtok.stream.rank import Placement


class SourceCursors:
    """Where every source of `curriculum` is for the worker at `placement`."""

    def __init__(
        self,
        curriculum: Curriculum,
        options: StreamOptions,
        placement: Placement,
        *,
        first_epoch: int,
        layout: dict | None = None,
    ):
        self.curriculum, self.placement = curriculum, placement
        self.first_epoch, self.layout = first_epoch, layout
        self.options = options
        self.parked: dict[int, dict] = {}

    def streams(self, stage: int) -> list[SourceSequences]:
        """Stage `stage`'s sources, each at its cursor (a source never read: at its start) and
        packing with the stage's window (a source left in another finishes its phase in this
        one first: ``SourceSequences``); they stay parked until the stage takes them
        (``take``)."""
        p = self.placement
        out = []
        sources = self.curriculum.sources
        stage_options = resolved(self.curriculum.options_for(stage, self.options), sources)
        for cid in self.curriculum.source_ids(stage):
            options = with_source_seed(stage_options, cid)
            remainder, first_epoch = None, self.first_epoch
            if self.layout is not None:
                remainder, first_epoch = remainder_packers(
                    sources[cid], options, self.layout, cid,
                    new_index=p.index, new_slices=p.world_size * p.num_workers,
                )  # fmt: skip
            source = SourceSequences(
                sources[cid], options, rank=p.rank, world_size=p.world_size,
                worker=p.worker, num_workers=p.num_workers, first_epoch=first_epoch,
                remainder=remainder,
            )  # fmt: skip
            parked = self.parked.get(cid)
            if parked is not None:
                source.continue_from(parked)
            out.append(source)
        return out

    def take(self, stage: int) -> None:
        """Stage `stage` now streams its sources: their positions live in its state."""
        for cid in self.curriculum.source_ids(stage):
            self.parked.pop(cid, None)

    def park(self, stage: int, sources: list[SourceSequences]) -> None:
        """Keep the positions of stage `stage`'s `sources`, which then let go of their shards."""
        for cid, source in zip(self.curriculum.source_ids(stage), sources, strict=True):
            self.parked[cid] = source.state_dict()
            source.close()

    def state(self) -> list[dict | None]:
        """Per source of the table: its parked position, or null (not read yet, or read by
        the current stage, whose state holds it)."""
        return [self.parked.get(c) for c in range(len(self.curriculum.sources))]

    def restore(self, saved: list, stage: int, in_mix: bool) -> None:
        """Take the parked positions of a saved ``sources`` list of a state in `stage` (whose
        mix holds its own sources' positions when `in_mix`)."""
        count = len(self.curriculum.sources)
        if len(saved) != count:
            raise ResumeStateError(
                f"staged_stream state: field 'sources' has {len(saved)} entries, this "
                f"curriculum {count} sources"
            )
        current = set(self.curriculum.source_ids(stage)) if in_mix else set()
        self.parked = {}
        for cid, position in enumerate(saved):
            if position is None:
                continue
            if cid in current:
                raise ResumeStateError(
                    f"staged_stream state: source {cid} is both parked and in the current stage"
                )
            position = SourceSequences.parse_state(position)
            self._check_window(cid, position, stage)
            self.parked[cid] = position

    def _check_window(self, cid: int, position: dict, stage: int) -> None:
        """A parked position was packed in the window of a stage up to `stage` that reads it
        (from 0.4 on, the only release that parks, every position records its window)."""
        lengths = {
            self.curriculum.options_for(k, self.options).seq_len
            for k in range(stage + 1)
            if cid in self.curriculum.source_ids(k)
        }
        window = position.get("window")
        if not isinstance(window, dict) or window.get("seq_len") not in lengths:
            raise ResumeStateError(
                f"staged_stream state: parked source {cid} must record the window it was packed "
                f"in, the seq_len of a stage that read it ({sorted(lengths)}), not {window!r}"
            )
