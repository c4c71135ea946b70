"""Getting per-worker dataset states out of a loader checkpoint, for elastic resume.

``ShardLoader.state_dict()`` lists them under ``workers``; ``StatefulDataLoader.state_dict()``
keeps each worker's ``dataset.state_dict()`` under
``_snapshot/_worker_snapshots/worker_<i>/dataset_state`` (with workers) or ``dataset_state``
(without). Gather these from every rank (or read every rank's checkpoint) and pass them all to
``merge_states`` to finish the epoch with another world size or number of workers::

    states = [s for rank_state in all_rank_loader_states for s in dataset_states(rank_state)]
    dataset = ShardStreamDataset(path, ...)          # the new layout
    dataset.load_state_dict(merge_states(states))    # before building the new DataLoader
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError


def dataset_states(loader_state: dict) -> list[dict]:
    """The dataset states of every worker in one rank's ShardLoader or StatefulDataLoader
    state."""
    if loader_state.get("kind") == "loader" or "shardtok_loader" in loader_state:
        return list(loader_state["workers"])
    workers = (loader_state.get("_snapshot") or {}).get("_worker_snapshots") or {}
    if workers:
        ordered = sorted(workers.values(), key=lambda w: int(w["worker_id"]))
        return [w["dataset_state"] for w in ordered]
    if loader_state.get("dataset_state") is not None:
        return [loader_state["dataset_state"]]
    raise ResumeStateError("no dataset state in this DataLoader state (did it iterate?)")


__all__ = ["dataset_states"]
