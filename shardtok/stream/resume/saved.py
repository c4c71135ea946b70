"""The states a user saves and hands back, as typed objects.

* ``WorkerState`` (kind ``dataset``): one (rank, worker)'s position, what
  ``ShardStreamDataset.state_dict()`` returns inside a worker and what a loader keeps per worker.
* ``MergedState`` (kinds ``merged``, ``merged_mix`` and ``merged_stages``): ``merge_states`` of
  every old (rank, worker), which finishes an epoch (a stage) with another layout.

``parse_saved`` is the one place a dict becomes one of these; nothing downstream looks at keys
to tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtok.stream import state as envelope
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.rank import Placement
from shardtok.stream.staged import StagedStream


@dataclass(frozen=True)
class WorkerState:
    epoch: int
    placement: Placement
    stream: dict | None  # the placed stream's own state; None before its first batch
    fingerprint: dict

    KIND = "dataset"
    FIELDS = {
        "epoch": envelope.INT,
        "placement": envelope.OBJECT,
        "stream": envelope.OPTIONAL_STATE,
        "fingerprint": envelope.OBJECT,
    }

    def to_dict(self) -> dict:
        return envelope.wrap(
            self.KIND,
            {
                "epoch": self.epoch,
                "placement": self.placement.to_dict(),
                "stream": self.stream,
                "fingerprint": self.fingerprint,
            },
        )


@dataclass(frozen=True)
class MergedState:
    """`stage` (curriculum stages only, kind ``merged_stages``): the stage p the merged layout
    continues at rank step `step` (the steps every old rank had taken); `layout` is then stage
    p's merged mix layout, or None when no old worker had started stage p (it starts fresh)."""

    epoch: int
    fingerprint: dict
    layout: dict | None  # the old layout's positions: {"world_size", "num_workers", ...}
    mixed: bool
    stage: int | None = None
    step: int = 0

    FIELDS = {"epoch": envelope.INT, "fingerprint": envelope.OBJECT}
    STAGES_FIELDS = {
        **FIELDS,
        "stage": envelope.INT,
        "step": envelope.INT,
        "elastic_mix": envelope.OPTIONAL_OBJECT,
    }

    @property
    def kind(self) -> str:
        if self.stage is not None:
            return "merged_stages"
        return "merged_mix" if self.mixed else "merged"

    @property
    def layout_key(self) -> str:
        return "elastic_mix" if self.mixed else "elastic"

    def to_dict(self) -> dict:
        fields = {"epoch": self.epoch, "fingerprint": self.fingerprint}
        if self.stage is not None:
            fields.update(stage=self.stage, step=self.step)
        return envelope.wrap(self.kind, {**fields, self.layout_key: self.layout})


MERGED_KINDS = ("merged", "merged_mix", "merged_stages")


def parse_saved(state: object) -> WorkerState | MergedState:
    """A worker state or a merged state, checked field by field."""
    if isinstance(state, dict) and state.get("kind") == "merged_stages":
        s = envelope.parse(state, "merged_stages", MergedState.STAGES_FIELDS)
        return MergedState(
            s["epoch"], s["fingerprint"], s["elastic_mix"], True, s["stage"], s["step"]
        )
    if isinstance(state, dict) and state.get("kind") in ("merged", "merged_mix"):
        mixed = state["kind"] == "merged_mix"
        key = "elastic_mix" if mixed else "elastic"
        fields = {**MergedState.FIELDS, key: envelope.OBJECT}
        s = envelope.parse(state, state["kind"], fields)
        return MergedState(s["epoch"], s["fingerprint"], s[key], mixed)
    s = envelope.parse(state, ("dataset", *MERGED_KINDS), WorkerState.FIELDS)
    placement = Placement.parse(s["placement"], "dataset state")
    return WorkerState(s["epoch"], placement, s["stream"], s["fingerprint"])


def saved_position(*saved: dict | MergedState | None) -> dict:
    """Where saved states are in a curriculum, as ``check_fingerprint``'s keyword arguments:
    the furthest (stage, 1-based step) of `saved` (stream states, None for a worker not started,
    merged states). A merged state at rank step T fixes the stage of step T + 1; a mix's own
    state is in stage 0 (``StagedStream.from_mix_state``). Empty when none is a state of stages
    (then every stage is compared)."""
    found: list[tuple[int, int]] = []
    for state in saved:
        if isinstance(state, MergedState):
            if state.stage is not None:
                found.append((state.stage, state.step + 1))
        elif state is None:
            found.append((0, 0))
        elif state.get("kind") == StagedStream.KIND:
            found.append(StagedStream.position(state))
        elif state.get("kind") == MixedStream.KIND and state.get("elastic") is None:
            found.append(StagedStream.position(StagedStream.from_mix_state(state)))
    if not found:
        return {}
    stage, step = max(found)
    return {"stage": stage, "step": step}
