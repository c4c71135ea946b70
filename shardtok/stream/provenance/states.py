"""The saved position a trace starts from: one rank's worker states, as every saver writes them,
read into the one ``RankState``.

Accepted: the CLI's state file (kind ``stream_file``: a ``RankState`` as written), a ``ShardLoader`` state
(kind ``loader``) and one dataset worker state (kind ``dataset``: a loader with 0 workers, or
``ShardStreamDataset.state_dict()`` in process).
A merged (elastic) state that no worker has streamed from yet names no step of its own and is
refused: trace with a state saved after its first batch. So is a state streamed on from the
merge of a mix or of one epoch's states: those streams count batches from the merge and do not
record its step (curriculum stages, and epochs streams merged from epochs streams, do, as
``first_step``).
"""

from __future__ import annotations

from dataclasses import replace

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.epochs_remainder import is_epochs_layout
from shardtok.stream.factory import NODE_CLASSES, StreamSetup, check_stream_state
from shardtok.stream.rank import worker_of
from shardtok.stream.resume.fingerprint import check_fingerprint
from shardtok.stream.resume.rank_state import FIELDS as FILE_FIELDS
from shardtok.stream.resume.rank_state import KIND as FILE_KIND
from shardtok.stream.resume.rank_state import LOADER_FIELDS, RankState
from shardtok.stream.resume.saved import MergedState, saved_position

# A trace replays the stream a state belongs to; on other data it would name other documents.
REPLAY_THE_SAME = (
    ": a trace replays the run the state belongs to, so give the config and options it was "
    "saved with"
)


def local_batches(stream: dict | None) -> int:
    """Batches a worker's stream state has yielded in its layout (all parts of a chained
    stream), read where its kind keeps them."""
    if stream is None:
        return 0
    cls = NODE_CLASSES[stream["kind"]]
    if "batches" in cls.FIELDS:  # chained streams count across their parts
        return int(stream["batches"])
    return int(stream[getattr(cls, "batcher_key", "batcher")]["batches"])


def saved_rank(state: object, setup: StreamSetup) -> RankState:
    """`state` (see the module docstring) checked, against `setup`'s fingerprint too, as a
    ``RankState``."""
    if isinstance(state, dict) and state.get("kind") == FILE_KIND:
        fields = envelope.parse(state, FILE_KIND, FILE_FIELDS)
        state = RankState(**{k: fields[k] for k in FILE_FIELDS})
    if isinstance(state, RankState):
        workers = [None if w is None else check_stream_state(w) for w in state.workers]
        check_fingerprint(state.fingerprint, setup.fingerprint, advice=REPLAY_THE_SAME,
                          **saved_position(*workers))  # fmt: skip
        saved = RankState(
            state.epoch, state.rank, state.world_size, state.batches, state.next_worker,
            workers, state.fingerprint,
        )  # fmt: skip
        counted = saved.first_step + sum(local_batches(w) for w in workers)
        if counted != state.batches:
            raise ResumeStateError(
                f"the state file says {state.batches} steps were taken, its worker streams "
                f"yielded {counted}"
            )
        return _checked(saved)
    if not isinstance(state, dict):
        raise ResumeStateError(
            f"a trace starts from a state file, a loader state or a dataset state, got "
            f"{type(state).__name__}"
        )
    envelope.check_version(state, "the state")
    if state.get("kind") == "loader":
        loader = envelope.parse(state, "loader", LOADER_FIELDS)
        items, next_worker = loader["workers"], loader["next_worker"]
        if len(items) != max(loader["num_workers"], 1):
            raise ResumeStateError(
                f"loader state: {len(items)} worker states for {loader['num_workers']} workers"
            )
    else:
        items, next_worker = [state], 0
    parsed = []
    for item in items:
        saved = setup.check_saved(item, advice=REPLAY_THE_SAME)
        if isinstance(saved, MergedState):
            raise ResumeStateError(
                "a merged (elastic) state not yet streamed from names no step: trace with the "
                "state saved after its first batch, or without a state"
            )
        parsed.append(saved)
    placements = {(s.epoch, s.placement.rank, s.placement.world_size) for s in parsed}
    if len(placements) != 1:
        raise ResumeStateError("the worker states belong to different epochs or ranks")
    for w, saved in enumerate(parsed):
        if (saved.placement.worker, saved.placement.num_workers) != (w, len(parsed)):
            raise ResumeStateError(
                f"worker state {w} is worker {saved.placement.worker} of "
                f"{saved.placement.num_workers}, expected {w} of {len(parsed)}"
            )
    workers = [s.stream for s in parsed]
    epoch, rank, world_size = placements.pop()
    saved = RankState(epoch, rank, world_size, 0, next_worker, workers, parsed[0].fingerprint)
    steps = saved.first_step + sum(local_batches(w) for w in workers)
    return _checked(replace(saved, batches=steps))


def _checked(saved: RankState) -> RankState:
    """The round robin's arithmetic must hold, or a trace would name another worker's batch;
    and the state must know its steps since the start."""
    for stream in saved.workers:
        if stream is not None and _resumed_without_step(stream):
            raise ResumeStateError(
                "the state continues an elastic resume (merge_states) of a mix or of one epoch, "
                "whose streams count batches from the resume without recording its step, so a "
                "training step cannot be placed in it: trace from a state saved before the "
                "resume"
            )
    slots = len(saved.workers)
    expected = worker_of(saved.batches, saved.first_step, slots)[0]
    if saved.batches < saved.first_step or saved.next_worker != expected:
        raise ResumeStateError(
            f"the state says {saved.batches} steps were taken (from step {saved.first_step}) and "
            f"worker {saved.next_worker} of {slots} is next; round robin makes it worker "
            f"{expected}"
        )
    return saved


def _resumed_without_step(stream: dict) -> bool:
    """Whether a worker stream continues a merged layout but not from a recorded step (chained
    streams record theirs as ``first_step``: stages always, an epochs stream when it merged
    epochs streams, whose layout has ``parts``, not one epoch's slice streams)."""
    kind, elastic = stream["kind"], stream.get("elastic")
    if kind == "elastic_stream":
        return True
    if kind == "epochs_stream":
        return elastic is not None and not is_epochs_layout(elastic)
    return kind == "mixed_stream" and elastic is not None
