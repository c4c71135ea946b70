"""A ``ShardLoader``'s saved state: kinds ``loader`` (the stream path) and ``memmap_loader``.

``loader``: ``num_workers``, ``next_worker`` (whose batch comes next) and ``workers``, one
dataset state per worker (``shardtok.stream.resume.saved``): every worker must be there, since a
missing one would silently drop its share of the epoch. ``memmap_loader``: per worker the
number of its batches taken, and what the batches were made from (``memmap``).
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.resume.rank_state import LOADER_FIELDS

MEMMAP_FIELDS = {**LOADER_FIELDS, "memmap": envelope.OBJECT}


def loader_state(num_workers: int, next_worker: int, workers: list[dict]) -> dict:
    return envelope.wrap(
        "loader", {"num_workers": num_workers, "next_worker": next_worker, "workers": workers}
    )


def memmap_loader_state(num_workers: int, next_worker: int, taken: list[int], memmap: dict) -> dict:
    return envelope.wrap(
        "memmap_loader",
        {
            "num_workers": num_workers,
            "next_worker": next_worker,
            "workers": [{"taken": int(t)} for t in taken],
            "memmap": memmap,
        },
    )


def parse_loader_state(state: object, *, memmap: bool) -> dict:
    """`state` checked as a loader state of the expected kind."""
    kind = "memmap_loader" if memmap else "loader"
    s = envelope.parse(state, kind, MEMMAP_FIELDS if memmap else LOADER_FIELDS)
    slots = max(s["num_workers"], 1)
    if len(s["workers"]) != slots:
        raise ResumeStateError(
            f"{kind} state: field 'workers' has {len(s['workers'])} entries for "
            f"{s['num_workers']} workers: every worker's position is needed"
        )
    envelope.check_range(kind, "next_worker", s["next_worker"], 0, slots - 1)
    if memmap:
        for w in s["workers"]:
            if not isinstance(w, dict) or set(w) != {"taken"}:
                raise ResumeStateError(f"{kind} state: each worker must be {{'taken': n}}")
        envelope.non_negative_ints(kind, "workers", [w["taken"] for w in s["workers"]])
    return s
