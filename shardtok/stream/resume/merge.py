"""``merge_states``: one elastic resume state from the saved states of every old (rank, worker).

The rule it prepares is in ``elastic.py`` (one dataset) and ``elastic_mix.py`` (a mix).
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError
from shardtok.stream.resume.elastic_mix import merge_mixed_states


def merge_states(states: list[dict]) -> dict:
    """One elastic resume state from the dataset states of every old (rank, worker).

    Each item is what ``ShardStreamDataset.state_dict()`` returned inside one worker of one rank
    (``shardtok.torch.dataset_states`` digs them out of StatefulDataLoader states).
    """
    if not states:
        raise ResumeStateError("merge_states: no states given")
    epochs = {int(s["epoch"]) for s in states}
    if len(epochs) != 1:
        raise ResumeStateError(f"merge_states: states of different epochs {sorted(epochs)}")
    fingerprints = {repr(s.get("fingerprint")) for s in states}
    if len(fingerprints) != 1:
        raise ResumeStateError("merge_states: states of different sources or options")
    if any(s.get("placement") is None for s in states):
        raise ResumeStateError("merge_states: a state without its placement (rank, worker)")
    placements: list[dict] = [s["placement"] for s in states]
    world = {p["world_size"] for p in placements}
    workers = {p["num_workers"] for p in placements}
    if len(world) != 1 or len(workers) != 1:
        raise ResumeStateError("merge_states: states from different world sizes or worker counts")
    world_size, num_workers = world.pop(), workers.pop()
    slices: list[dict | None] = [None] * (world_size * num_workers)
    indices = []
    mixed = False
    for state, p in zip(states, placements, strict=True):
        index = p["rank"] * num_workers + p["worker"]
        if index in indices:
            raise ResumeStateError(f"merge_states: rank {p['rank']} worker {p['worker']} twice")
        indices.append(index)
        stream = state.get("stream")
        if stream is not None and "first_epoch" in stream:
            mixed = True
        elif stream is not None and ("batcher" not in stream or "epoch" not in stream):
            raise ResumeStateError(
                "merge_states: this state is of an elastically resumed epoch; finish that epoch "
                "with the same world size and number of workers"
            )
        else:
            slices[index] = None if stream is None else stream["batcher"]
    missing = [i for i in range(len(slices)) if i not in indices]
    if missing:
        raise ResumeStateError(
            f"merge_states: the states of slices {missing[:8]} (rank * {num_workers} + worker) "
            f"are missing; all {len(slices)} are needed"
        )
    if mixed:
        return {
            "epoch": epochs.pop(),
            "fingerprint": states[0].get("fingerprint"),
            "elastic_mix": merge_mixed_states(
                states, indices, world_size, num_workers, int(states[0]["epoch"])
            ),
        }
    return {
        "epoch": epochs.pop(),
        "fingerprint": states[0].get("fingerprint"),
        "elastic": {"world_size": world_size, "num_workers": num_workers, "slices": slices},
    }
