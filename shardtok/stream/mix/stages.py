"""Curriculum stages: Nanotron's ``data_stages``, each a mix that starts at a training step.

A config lists stages in order (reference note 003)::

    seq_len: 2048            # stream options shared by every stage sit at the top
    batch_size: 8
    data_stages:
      - name: General purpose training (Single dataset)
        start_training_step: 1
        data: {dataset: {dataset_path: datasets/web}, seed: 1234}
      - name: Blended
        start_training_step: 15
        data: {dataset: {dataset_path: {datasets/web: 0.8, datasets/code: 0.2}}, seed: 1234}

Steps are 1-based global training steps, as Nanotron counts them; a step is one batch per
rank. Stage k serves steps ``[start_k, start_{k+1})``; the last stage serves every later step.
The first stage starts at step 1 and starts increase strictly. Each stage has its own sources
and weights and may set its own ``batch_size`` (a batch-size ramp-up) and ``seq_len`` (a
sequence-length curriculum); any other stream option written inside a stage must be the same in
every stage.

What a stage switch does to the sources is ``stage_switch`` (top level):

* ``continue`` (the default): every source continues from its cursor, the documents it has not
  served yet; no document comes twice before its source's epoch ends (a stage with another
  ``seq_len`` first packs the rest of the source's epoch in its rows). A source keeps one seed
  for the whole run (the curriculum's seed and its number in the source table), so stages may
  not set seeds that differ.
* ``restart``: Nanotron's rule: each stage is a fresh mix whose sources start from their
  beginning (with the stage's own ``seed`` when it sets one), so documents an earlier stage
  read can come again. What releases before 0.4 did; their states resume under it.

Sources are numbered across the whole curriculum in order of first appearance (the same
location, or the same subset of its shards, in two stages is one source): batches' ``source_ids`` name them by that number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shardtok._safe_yaml import shown
from shardtok.dataset.source import DatasetSource
from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.mix.spec import (
    MixSpec,
    check_tokenizers,
    config_options,
    load_mix_config,
    read_config,
    section_mix,
    stage_entries,
)
from shardtok.stream.options import StreamOptions
from shardtok.stream.rank import first_local

STAGE_SWITCHES = ("continue", "restart")
OWN_OPTIONS = ("seed", "batch_size", "seq_len")  # what a stage may set for itself


@dataclass(frozen=True)
class Stage:
    name: str
    start_step: int  # 1-based global training step (Nanotron's start_training_step)
    mix: MixSpec
    seed: int | None = None  # the stage's own seed; None: the shared one
    batch_size: int | None = None  # the stage's own batch size; None: the shared one
    seq_len: int | None = None  # the stage's own sequence length; None: the shared one

    @property
    def own_options(self) -> dict[str, int]:
        """The stream options this stage sets for itself."""
        own = {"seed": self.seed, "batch_size": self.batch_size, "seq_len": self.seq_len}
        return {k: v for k, v in own.items() if v is not None}


@dataclass
class Curriculum:
    """Stages in order, the stream options they share, and the curriculum's source table."""

    stages: list[Stage]
    options: dict[str, Any] = field(default_factory=dict)
    where: str = "curriculum"
    stage_switch: str = "continue"

    @property
    def continues(self) -> bool:
        """Whether a stage switch continues every source from its cursor (module docstring)."""
        return self.stage_switch == "continue"

    @property
    def sources(self) -> list[DatasetSource]:
        """Every distinct source (by location and subset), in order of first appearance."""
        seen: dict[object, DatasetSource] = {}
        for stage in self.stages:
            for source in stage.mix.sources:
                seen.setdefault(source.key, source)
        return list(seen.values())

    def source_ids(self, stage: int) -> list[int]:
        """The curriculum-wide ids of stage `stage`'s sources."""
        ids = {s.key: i for i, s in enumerate(self.sources)}
        return [ids[s.key] for s in self.stages[stage].mix.sources]

    @property
    def starts(self) -> list[int]:
        """Each stage's first rank step, 0-based."""
        return [s.start_step - 1 for s in self.stages]

    def stage_of_step(self, step: int) -> int:
        """The stage serving 1-based training step `step`."""
        if step < 1:
            raise UsageError(f"training steps count from 1, got {step}")
        return max(k for k, s in enumerate(self.stages) if s.start_step <= step)

    def options_for(self, stage: int, options: StreamOptions) -> StreamOptions:
        """`options` with stage `stage`'s own seed, batch size and sequence length, where it
        sets them."""
        return replace(options, **self.stages[stage].own_options)

    def check_seeds(self, options: StreamOptions) -> None:
        """Refuse stage seeds that differ when stages continue their sources: a source keeps one
        order for the whole run."""
        if not self.continues:
            return
        seeds = [(s.name, self.options_for(k, options).seed) for k, s in enumerate(self.stages)]
        for name, seed in seeds[1:]:
            if seed != seeds[0][1]:
                raise UsageError(
                    f"{self.where}: stage {shown(seeds[0][0])} has seed {seeds[0][1]}, stage "
                    f"{shown(name)} {seed}: with stage_switch: continue every source keeps one "
                    "order for the whole run; set one seed, or stage_switch: restart for fresh "
                    "sources (and their own seeds) in every stage"
                )

    def stage_spec(self, stage: int) -> MixSpec:
        """Stage `stage` alone as a mix whose options are the shared ones plus the stage's own:
        what a one-stage config streams (exactly a plain mix, its states and fingerprint)."""
        chosen = self.stages[stage]
        return replace(chosen.mix, options={**self.options, **chosen.own_options})

    def local_begins(self, first_step: int, worker: int, num_workers: int) -> list[int]:
        """For one DataLoader worker: the local batch number at which each stage begins.

        Worker `worker` of `num_workers` yields the rank's steps ``first_step + j * K + w``
        (0-based; the loader takes batches round-robin; `first_step` is where this layout's
        stream began: 0, or the step an elastic resume happened at), so stage k begins at its
        local batch ``max(0, ceil((S_k - first_step - w) / K))``."""
        return [first_local(start, first_step, worker, num_workers) for start in self.starts]

    def check_tokenizers(self) -> None:
        """Refuse a curriculum whose sources (over all stages) were tokenized differently."""
        allow = all(stage.mix.allow_mixed_tokenizers for stage in self.stages)
        check_tokenizers(MixSpec(self.sources, [1] * len(self.sources), {}, allow))


def load_curriculum(
    config: str | Path | Mapping[str, Any], *, storage_options: dict | None = None
) -> Curriculum:
    """Every stage of a config (a flat config or one stage gives a one-stage curriculum)."""
    data, base, where = read_config(config)
    top = config_options(data, where)
    allow_top = data.get("allow_mixed_tokenizers", False)
    switch = data.get("stage_switch", "continue")
    if switch not in STAGE_SWITCHES:
        raise UsageError(
            f"{where}: stage_switch must be one of {', '.join(STAGE_SWITCHES)}, got {shown(switch)}"
        )
    if "data_stages" not in data:
        spec = section_mix(data, allow_top, storage_options, base, where)
        stage = Stage("stage 0", 1, spec, None)
        return Curriculum([stage], {**top, **spec.options}, where, switch)
    entries = stage_entries(data, where)
    stages: list[Stage] = []
    own: list[dict[str, Any]] = []
    for k, entry in enumerate(entries):
        name = entry.get("name", f"stage {k}")
        if not isinstance(name, str) or not name:
            raise ShardtokError(
                f"{where}: data stage {k}: name must be a non-empty string, got {shown(name)}"
            )
        start = entry.get("start_training_step", 1 if k == 0 else None)
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ShardtokError(
                f"{where}: data stage {shown(name)}: start_training_step must be an integer "
                f">= 1, got {shown(start)}"
            )
        section = entry.get("data", {})
        if not isinstance(section, Mapping):
            raise ShardtokError(f"{where}: data stage {shown(name)}: 'data' must be a mapping")
        spec = section_mix(section, allow_top, storage_options, base,
                           f"{where}: stage {shown(name)}")  # fmt: skip
        stages.append(Stage(name, start, spec, *(spec.options.pop(k, None) for k in OWN_OPTIONS)))
        own.append(spec.options)
    _check_order(stages, where)
    shared = _shared_options(stages, own, top, where)
    # One object per location (and subset): a source in several stages reads its manifest once.
    first: dict[object, DatasetSource] = {}
    for stage in stages:
        stage.mix.sources = [first.setdefault(s.key, s) for s in stage.mix.sources]
    return Curriculum(stages, shared, where, switch)


def load_stage(
    config: str | Path | Mapping[str, Any],
    stage: str | int,
    *,
    storage_options: dict | None = None,
) -> MixSpec:
    """One data stage alone (an index or a name), as a plain mix: ``load_mix_config``'s stage,
    its options the config's top-level stream options (shared by the stages) under its own."""
    spec = load_mix_config(config, stage=stage, storage_options=storage_options)
    data, _, where = read_config(config)
    spec.options = {**config_options(data, where), **spec.options}
    return spec


def _check_order(stages: list[Stage], where: str) -> None:
    if stages[0].start_step != 1:
        raise ShardtokError(
            f"{where}: the first data stage ({shown(stages[0].name)}) must start at step 1, not "
            f"{stages[0].start_step}"
        )
    for before, after in zip(stages, stages[1:]):
        if after.start_step <= before.start_step:
            raise ShardtokError(
                f"{where}: data stage {shown(after.name)} starts at step {after.start_step}, "
                f"not after {shown(before.name)} (step {before.start_step}): stages run in order"
            )
    names = [s.name for s in stages]
    for name in names:
        if names.count(name) > 1:
            raise ShardtokError(f"{where}: two data stages are named {shown(name)}")


def _shared_options(stages: list[Stage], own: list[dict], top: dict, where: str) -> dict[str, Any]:
    """The top-level options plus those written inside stages, which every stage must agree on
    (only ``OWN_OPTIONS`` are a stage's own)."""
    if len(stages) == 1:  # its seed stays its own: options_for(0) applies it
        mine = {k: v for k, v in stages[0].own_options.items() if k != "seed"}
        return {**top, **own[0], **mine}
    shared = dict(top)
    for key in sorted({k for options in own for k in options}):
        values = [(s.name, options.get(key, top.get(key))) for s, options in zip(stages, own)]
        first_name, first = values[0]
        for name, value in values[1:]:
            if value != first:
                raise ShardtokError(
                    f"{where}: stage {shown(first_name)} sets {key}={shown(first)}, stage "
                    f"{shown(name)} {shown(value)}: stream options other than "
                    f"{', '.join(OWN_OPTIONS)} are shared by every stage; set them once at the "
                    "top level"
                )
        shared[key] = first
    return shared
