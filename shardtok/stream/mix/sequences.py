"""Weighted mixing of several shard datasets: one packed sequence at a time, by weight.

Every packed sequence comes from one source (as Megatron's ``BlendedDataset`` and Nanosets), so
weights count packed sequences, i.e. tokens (``seq_len + 1`` slots each). Which source serves
step ``s`` is the ``MixSchedule`` (``mix/schedule.py``).

Each (rank, worker) runs the schedule over its own per-source slice streams: source ``i``'s
epoch plan is cut into ``world_size * num_workers`` slices as for a single dataset, and this
worker reads slice ``(rank, worker)`` of it. A source that runs out starts its next epoch (a
fresh shard permutation) in place, so a mixed stream never ends and every rank yields as many
batches as it is asked for. The global mix holds because every worker's mix does.

State: the schedule step plus, per source, its epoch and packer state: a few integers per source.
One source's cursor is ``SourceSequences`` (``mix/source.py``).

Sources with and without loss masks mix: a row from a masked source carries its mask as flag
bits of its tokens (``stream.masked``), a row from a source without has none (all trained), and
each row says whether it is fine-tuning data (``row_masked``) so the batch applies the right
boundary rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.mix.schedule import MixSchedule
from shardtok.stream.mix.source import SourceSequences
from shardtok.stream.nodes.packer import Packer, packed_sequence
from shardtok.stream.sequence import PackedSequence


class MixedSequences(Packer):
    """Packed sequences drawn from several sources by the greedy weighted schedule."""

    KIND = "mix_sequences"
    FIELDS = {"step": envelope.INT, "sources": envelope.LIST}

    def __init__(
        self,
        sources: Sequence[SourceSequences],
        weights: Sequence[float | Fraction],
        source_ids: Sequence[int] | None = None,
        *,
        carry: bool = False,
    ):
        """`source_ids`: what each source is called in batches' ``source_ids`` (default its
        index; a curriculum numbers the sources of all its stages together). `carry`: the
        sources continue where they are (a curriculum stage that continues its sources): a
        fresh start restarts the schedule only, and their counts include earlier stages'."""
        super().__init__()
        self.carry = carry
        if len(sources) != len(weights) or not sources:
            raise ValueError("give one weight per source, and at least one source")
        self.source_ids = list(range(len(sources)) if source_ids is None else source_ids)
        if len(self.source_ids) != len(sources):
            raise ValueError("give one source id per source")
        self._row_source = 0
        self.sources = list(sources)
        self.schedule = MixSchedule(weights)
        self.window = self.sources[0].window
        self.masked = any(s.masked for s in self.sources)
        self._row_masked = False
        self.step = 0

    def _reset(self, state: dict | None) -> None:
        if state is None:
            self.step = 0
            for source in [] if self.carry else self.sources:
                source.reset(None)
            return
        state = self.parse_state(state)
        if len(state["sources"]) != len(self.sources):
            raise ResumeStateError(
                f"mix_sequences state: field 'sources' has {len(state['sources'])} entries, "
                f"this mix {len(self.sources)}"
            )
        self._check_step(state["step"], [SourceSequences.served(s) for s in state["sources"]])
        self.step = state["step"]
        for source, source_state in zip(self.sources, state["sources"], strict=True):
            source.reset(source_state)

    def _check_step(self, step: int, served: list[int]) -> None:
        """Every row came from one source: a step its sources did not serve is an edit, refused
        before the schedule is computed up to it. (Their shares may differ from this schedule's:
        a resume that ignores the fingerprint may change the weights.)"""
        if sum(served) < step or (sum(served) != step and not self.carry):
            raise ResumeStateError(
                f"mix_sequences state: field 'step' is {step:,}, but its sources served "
                f"{sum(served):,} sequences in all"
            )
        if step > MixSchedule.MAX_STEPS:
            raise ResumeStateError(
                f"mix_sequences state: field 'step' is {step:,}, more than a mix can count "
                f"(at most {MixSchedule.MAX_STEPS:,})"
            )

    def close(self) -> None:
        for source in self.sources:
            source.close()

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        return self._wrap(step=self.step, sources=[s.state_dict() for s in self.sources])

    @classmethod
    def source_states(cls, state: dict) -> list[dict]:
        return cls.parse_state(state)["sources"]

    @property
    def row_masked(self) -> bool:
        return self._row_masked

    @property
    def row_source(self) -> int:
        return self._row_source

    def next_into(self, out: np.ndarray) -> tuple[list[int], int]:
        if not self._started:
            self.reset(None)
        index = self.schedule[self.step]
        source = self.sources[index]
        placed = source.next_into(out)
        self._row_masked = source.masked
        self._row_source = self.source_ids[index]
        self.step += 1
        return placed

    def _next(self) -> PackedSequence:
        out = np.empty(self.window, dtype=np.int64)
        starts, length = self.next_into(out)
        return packed_sequence(out, starts, length, self._row_masked)

    @property
    def passes_in_runs(self) -> bool:
        """Whether every source packs concat windows without overlap (``pass_rows`` applies;
        not ``contiguous``, which tells the batcher a whole batch is one run of tokens)."""
        return all(source.passes_in_runs for source in self.sources)

    def pass_rows(self, rows: int) -> None:
        """Pass over the next `rows` rows without building them: the schedule says how many
        each source serves, and sources are independent streams, so each passes over its share
        at once (``SourceSequences.pass_rows``)."""
        if not self._started:
            self.reset(None)
        before = self.schedule.counts(self.step)
        after = self.schedule.counts(self.step + rows)
        for source, a, b in zip(self.sources, before, after, strict=True):
            source.pass_rows(b - a)
        self.step += rows

    def shares(self) -> list[dict]:
        """Per source: sequences served, share of all, epochs started."""
        total = max(self.step, 1)
        return [
            {
                "source": s.source.display,
                "sequences": s.sequences,
                "share": s.sequences / total,
                "epoch": s.epoch,
                "overlong_documents": s.overlong_counts()[0],
                "overlong_tokens_dropped": s.overlong_counts()[1],
            }
            for s in self.sources
        ]
