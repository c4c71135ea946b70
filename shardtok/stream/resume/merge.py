"""``merge_states``: one elastic resume state from the saved states of every old (rank, worker).

The rule it prepares is in ``stream/remainder.py`` (one dataset), ``mix/remainder.py`` (a mix) and
``elastic_stages.py`` (curriculum stages).
"""

from __future__ import annotations

from shardtok.errors import ResumeStateError
from shardtok.stream.epochs_remainder import merge_epochs_states
from shardtok.stream.mix.remainder import merge_mixed_states
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.options import StreamOptions
from shardtok.stream.remainder import SAVED_OPTIONS, slice_progress
from shardtok.stream.resume.elastic_stages import merge_staged_states
from shardtok.stream.resume.fingerprint import OPTION_DEFAULTS
from shardtok.stream.resume.saved import MergedState, WorkerState, parse_saved


def dataset_states(saved: object) -> list[dict]:
    """The dataset states of every worker in `saved`: one dataset state, one rank's
    ``ShardLoader`` or ``StatefulDataLoader`` state, or a list of any of these (every rank's)."""
    if isinstance(saved, (list, tuple)):
        return [s for item in saved for s in dataset_states(item)]
    if not isinstance(saved, dict):
        raise ResumeStateError(f"expected a saved state, got {type(saved).__name__}")
    if saved.get("kind") == "loader" or "shardtok_loader" in saved:
        return list(saved["workers"])
    workers = (saved.get("_snapshot") or {}).get("_worker_snapshots") or {}
    if workers:
        ordered = sorted(workers.values(), key=lambda w: int(w["worker_id"]))
        return [w["dataset_state"] for w in ordered]
    if "_snapshot" in saved or "dataset_state" in saved:
        if saved.get("dataset_state") is not None:
            return [saved["dataset_state"]]
        raise ResumeStateError("no dataset state in this DataLoader state (did it iterate?)")
    return [saved]


def merge_states(states: list[dict]) -> dict:
    """One elastic resume state from the dataset states of every old (rank, worker).

    Each item is what ``ShardStreamDataset.state_dict()`` returned inside one worker of one rank
    (``shardtok.torch.dataset_states`` digs them out of loader states).
    """
    if not states:
        raise ResumeStateError("merge_states: no states given")
    parsed = []
    for state in states:
        saved = parse_saved(state)
        if isinstance(saved, MergedState):
            raise ResumeStateError(
                "merge_states: a merged state cannot be merged again; finish its epoch with the "
                "layout it was loaded into"
            )
        parsed.append(saved)
    return merge_worker_states(parsed).to_dict()


def merge_worker_states(states: list[WorkerState]) -> MergedState:
    epochs = {s.epoch for s in states}
    if len(epochs) != 1:
        raise ResumeStateError(f"merge_states: states of different epochs {sorted(epochs)}")
    if len({repr(s.fingerprint) for s in states}) != 1:
        raise ResumeStateError("merge_states: states of different sources or options")
    layouts = {(s.placement.world_size, s.placement.num_workers) for s in states}
    if len(layouts) != 1:
        raise ResumeStateError("merge_states: states from different world sizes or worker counts")
    world_size, num_workers = layouts.pop()
    kinds = {s.stream["kind"] for s in states if s.stream is not None}
    staged = kinds == {"staged_stream"} or (not kinds and "stages" in states[0].fingerprint)
    # A staged state's stage-wise check comes later; an epochs stream past an elastic remainder
    # merges again (elastic_epochs checks where).
    if (
        not staged
        and kinds != {"epochs_stream"}
        and (
            kinds & {"elastic_stream"}
            or any(s.stream is not None and s.stream.get("elastic") is not None for s in states)
        )
    ):
        raise ResumeStateError(
            "merge_states: this state is of an elastically resumed epoch; finish that epoch "
            "with the same world size and number of workers"
        )
    if len(kinds) > 1:
        raise ResumeStateError(f"merge_states: states of different kinds {sorted(kinds)}")
    by_index: dict[int, WorkerState] = {}
    for s in states:
        index = s.placement.index
        if index in by_index:
            raise ResumeStateError(
                f"merge_states: rank {s.placement.rank} worker {s.placement.worker} twice"
            )
        by_index[index] = s
    count = world_size * num_workers
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise ResumeStateError(
            f"merge_states: the states of slices {missing[:8]} (rank * {num_workers} + worker) "
            f"are missing; all {count} are needed"
        )
    epoch, fingerprint = epochs.pop(), states[0].fingerprint
    ordered = [by_index[i] for i in range(count)]
    was = {"was": saved_with(fingerprint)}  # what the new layout may change
    if staged:
        stage, step, layout = merge_staged_states(
            [s.stream for s in ordered], world_size, num_workers, epoch, fingerprint
        )
        layout = None if layout is None else {**layout, **was}
        return MergedState(epoch, fingerprint, layout, mixed=True, stage=stage, step=step)
    if kinds == {"epochs_stream"}:
        layout = merge_epochs_states([s.stream for s in ordered], world_size, num_workers, epoch)
        return MergedState(epoch, fingerprint, {**layout, **was}, mixed=False)
    if kinds == {"mixed_stream"}:
        streams = [s.stream for s in ordered]
        layout = merge_mixed_states(streams, world_size, num_workers, epoch)
        return MergedState(epoch, fingerprint, {**layout, **was}, mixed=True)
    slices = []
    for s in ordered:
        if s.stream is None:
            slices.append(slice_progress(None, 0))
        else:
            packer, real_tokens = Batcher.progress(s.stream["batcher"])
            slices.append(slice_progress(packer, real_tokens))
    layout = {"world_size": world_size, "num_workers": num_workers, "slices": slices, **was}
    return MergedState(epoch, fingerprint, layout, mixed=False)


def cuts_rows_anew(fingerprint: dict | None, options: StreamOptions) -> bool:
    """Whether states saved under `fingerprint` make rows of another length or stride than
    `options` (resolved): they then resume only merged (the remainder rule)."""
    was = saved_with(fingerprint or {})
    return (was["seq_len"], was["stride"] or was["seq_len"] + 1) != (
        options.seq_len,
        options.stride or options.seq_len + 1,
    )


def saved_with(fingerprint: dict) -> dict:
    """The options of ``SAVED_OPTIONS`` the states were saved with (from their fingerprint)."""
    options = {**OPTION_DEFAULTS, **(fingerprint.get("options") or {})}
    return {key: options.get(key) for key in SAVED_OPTIONS}


def loadable(state: object, options: StreamOptions) -> object:
    """What a dataset loads for `state`: a list of states (every rank's loader or dataset
    states) merged; the whole position of a run of one process without workers whose rows had
    another length than `options` (resolved) merged, so it resumes by the remainder rule by
    itself; anything else as given (its parse names what is wrong with it)."""
    if isinstance(state, (list, tuple)):
        return merge_states(dataset_states(state))
    if not isinstance(state, dict) or state.get("kind") != "dataset":
        return state
    placement = state.get("placement")
    alone = isinstance(placement, dict) and placement.get("world_size") == 1
    alone = alone and placement.get("num_workers") == 1
    fingerprint = state.get("fingerprint")
    if alone and isinstance(fingerprint, dict) and cuts_rows_anew(fingerprint, options):
        return merge_states([state])
    return state
