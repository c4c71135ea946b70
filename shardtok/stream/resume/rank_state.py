"""``RankState``: one rank's position, the one form every saver's rank state is read into.

A rank's state is every worker stream's state (positions and counters only), which worker the
round robin serves next (``stream/rank.py``), how many batches (steps) the rank has taken and
the fingerprint of the sources and options. ``shardtok stream --state-out`` writes it as is, a
state of kind ``stream_file``; ``provenance.states.saved_rank`` also reads a ``ShardLoader``
state or one dataset state into it. The file is written to a temporary name and renamed, so a job killed while saving leaves the previous file intact. A file written by
shardtok 0.1 (format ``shardtok-stream-state``, no envelope) is refused, naming that release.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope

# What ``ShardLoader.state_dict()`` writes (kind ``loader``): the workers' dataset states and
# whose batch is next; a trace reads it into a ``RankState`` too.
LOADER_FIELDS = {"num_workers": envelope.INT, "next_worker": envelope.INT, "workers": envelope.LIST}

KIND = "stream_file"
FIELDS = {
    "epoch": envelope.INT,
    "rank": envelope.INT,
    "world_size": envelope.INT,
    "batches": envelope.INT,
    "next_worker": envelope.INT,
    "workers": envelope.LIST,
    "fingerprint": envelope.OBJECT,
}


@dataclass(frozen=True)
class RankState:
    epoch: int
    rank: int
    world_size: int
    batches: int  # the rank's steps taken, from the start of the epoch or of the run
    next_worker: int
    workers: list  # one stream state (or None: not started) per worker
    fingerprint: dict | None

    @property
    def first_step(self) -> int:
        """The rank step this layout's streams began at: 0, or the step of an elastic resume
        (chained streams record it as ``first_step``; every worker the same)."""
        starts = {int(w.get("first_step", 0)) for w in self.workers if w is not None}
        if len(starts) > 1:
            raise ResumeStateError(f"the worker states began at different steps {sorted(starts)}")
        return starts.pop() if starts else 0

    def to_dict(self) -> dict:
        return envelope.wrap(KIND, {k: getattr(self, k) for k in FIELDS})


def save_state_file(path: str | Path, state: RankState) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state.to_dict(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_state_file(path: str | Path, check_state=lambda state: state) -> RankState:
    """The file at `path`, checked; `check_state` checks each worker's stream state
    (``shardtok.stream.factory.check_stream_state``)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeStateError(f"{path}: cannot read the stream state: {exc}") from None
    if not isinstance(doc, dict):
        raise ResumeStateError(f"{path}: not a shardtok stream state file")
    try:
        s = envelope.parse(doc, KIND, FIELDS)
        if s["world_size"] < 1 or s["rank"] >= s["world_size"]:
            raise ResumeStateError(f"rank {s['rank']} of world size {s['world_size']}")
        if not s["workers"]:
            raise ResumeStateError("field 'workers' is empty")
        envelope.check_range(KIND, "next_worker", s["next_worker"], 0, len(s["workers"]) - 1)
        for w in s["workers"]:
            if w is not None:
                check_state(w)
    except ResumeStateError as exc:
        raise ResumeStateError(f"{path}: {exc}") from None
    return RankState(**{k: s[k] for k in FIELDS})
