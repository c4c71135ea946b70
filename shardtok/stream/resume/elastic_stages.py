"""Elastic resume of curriculum stages: continue the stage under way with another layout.

Every old rank has taken ``T = first_step + (its workers' local batches)`` steps (the loader
takes batches round-robin), and every rank must have taken the same number. The new layout
continues at rank step T in stage p, the stage of (1-based) step T + 1:

* old workers whose state is in stage p hand over their stage-p mix positions, merged with the
  weighted-mix rule (``mix/remainder.py``): every source finishes the old workers' current source
  epochs in the new layout, without repeating or skipping a document of them;
* old workers still in an earlier stage (they had not yielded a batch of stage p; the switch is
  lazy) count as not started in p: their stage-p slices are read untouched;
* when no old worker had started stage p (T is its first step) there is nothing to hand over and
  the new layout starts stage p fresh, as it would have without the resume.

The new layout's staged streams begin at step T (worker w yields the rank's steps
``T + j * K + w``), so later stages still begin at their start steps. Stage p still ends where
it always did: what its steps do not reach of the handed-over remainder stays unread, as any
stage leaves the rest of its sources (a new worker whose first step is already in stage p + 1
reads none of its share). Refused, besides what
``merge_states`` refuses for any state: ranks at different steps, and a stage p that was itself
resumed elastically (finish that stage with the layout it was loaded into).
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError
from shardtok.stream.mix.remainder import merge_mixed_states, merge_source_positions
from shardtok.stream.mix.sequences import MixedSequences
from shardtok.stream.mix.source import SourceSequences
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.resume.fingerprint import check_shape
from shardtok.stream.staged import StagedStream


def merge_staged_states(
    streams: list[dict | None], world_size: int, num_workers: int, epoch: int, fingerprint: dict
) -> tuple[int, int, dict | None]:
    """(stage p, rank step T, stage p's merged mix layout or None) from every old slice's
    staged_stream state (None: not started), in slice order."""
    parsed = [None if s is None else StagedStream.parse_state(s) for s in streams]
    first_steps = {s["first_step"] for s in parsed if s is not None}
    if len(first_steps) > 1:
        raise ResumeStateError(
            f"merge_states: staged states that began at different steps {sorted(first_steps)}"
        )
    first_step = first_steps.pop() if first_steps else 0
    steps = [
        first_step
        + sum(
            s["batches"]
            for s in parsed[rank * num_workers : (rank + 1) * num_workers]
            if s is not None
        )
        for rank in range(world_size)
    ]
    for rank, step in enumerate(steps):
        if step != steps[0]:
            raise ResumeStateError(
                f"merge_states: rank 0 had taken {steps[0]} steps, rank {rank} {step}: save "
                "every rank after the same number of steps"
            )
    step = steps[0]
    stages = check_shape(fingerprint, "merge_states: the states' fingerprint").get("stages")
    if stages is None:
        raise ResumeStateError("merge_states: staged states without their stages' fingerprint")
    stage = max((k for k, s in enumerate(stages) if s["start_step"] <= step + 1), default=0)
    name = stages[stage].get("name")
    if "stage_switch" in fingerprint:  # every source continues: all of them are handed over
        return stage, step, _merge_continued(parsed, fingerprint, world_size, num_workers, epoch)
    in_stage: list[dict | None] = []
    for s in parsed:
        if s is None or s["stage"] < stage:
            in_stage.append(None)
            continue
        if s["stage"] > stage:
            raise ResumeStateError(
                f"merge_states: a worker's state is in stage {s['stage']}, past stage {stage} "
                f"({name!r}) of step {step + 1} its rank had reached"
            )
        if (s["elastic"] or {}).get("stage") == stage:
            raise ResumeStateError(
                f"merge_states: stage {stage} ({name!r}) of this state was itself resumed "
                "elastically; finish that stage with the same world size and number of workers"
            )
        in_stage.append(s["mix"])
    if all(s is None for s in in_stage):
        return stage, step, None
    return stage, step, merge_mixed_states(in_stage, world_size, num_workers, epoch)


def _merge_continued(
    parsed: list[dict | None], fingerprint: dict, world_size: int, num_workers: int, epoch: int
) -> dict | None:
    """Stages that continue their sources: every source of the curriculum's table, in every
    old slice, is where that slice's current stage or a parked position left it (or unread),
    and each finishes its old epochs in the new layout, whichever stage reads it next."""
    table = fingerprint.get("sources", [])
    positions: list[list[dict | None]] = [[None] * len(parsed) for _ in table]
    ids = _stage_source_ids(fingerprint)
    for index, s in enumerate(parsed):
        if s is None:
            continue
        found = dict(enumerate(s.get("sources") or []))
        if s["stage"] >= len(ids):
            raise ResumeStateError(
                f"merge_states: a worker's state is in stage {s['stage']}, its fingerprint has "
                f"{len(ids)} stages"
            )
        if s["mix"] is not None:
            inner = Batcher.progress(MixedStream.parse_state(s["mix"])["batcher"])[0]
            found.update(zip(ids[s["stage"]], MixedSequences.source_states(inner)))
        for cid, state in found.items():
            if state is None:
                continue
            if cid >= len(table):
                raise ResumeStateError(
                    "merge_states: a staged state names more sources than its fingerprint"
                )
            if SourceSequences.progress(state)[3]:
                raise ResumeStateError(
                    f"merge_states: source {cid} is still finishing an earlier elastic resume's "
                    "remainder; resume with the layout it was loaded into"
                )
            positions[cid][index] = state
    if all(p is None for per_slice in positions for p in per_slice):
        return None
    return merge_source_positions(positions, world_size, num_workers, epoch)


def _stage_source_ids(fingerprint: dict) -> list[list[int]]:
    """Per stage, its sources' numbers in the curriculum's table (``id``, which the
    fingerprint of stages that continue their sources records)."""
    try:
        return [[int(e["id"]) for e in stage["sources"]] for stage in fingerprint["stages"]]
    except (KeyError, TypeError, ValueError):
        raise ResumeStateError(
            "merge_states: the states' fingerprint does not number its stages' sources"
        ) from None
