"""The state envelope: every state names its format, version and kind, and a state that is not
what it claims (hand-edited, truncated, of another kind or release) is refused naming the field."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from shardtok.errors import ResumeStateError
from shardtok.stream import merge_states
from shardtok.stream import state as envelope
from shardtok.stream.nodes import ArrayDocuments, Batcher, ConcatPacker, GreedyPacker
from shardtok.stream.nodes.base import take
from shardtok.stream.resume.saved import parse_saved


def docs(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, size=int(rng.integers(1, 40))) for _ in range(n)]


def concat_batcher(num_batches=None):
    return Batcher(ConcatPacker(ArrayDocuments(docs()), 15), 2, num_batches=num_batches)


def saved_after(make, k):
    node = make()
    take(node, k)
    return json.loads(json.dumps(node.state_dict()))


def test_every_level_is_an_envelope():
    state = saved_after(concat_batcher, 3)
    for level, kind in ((state, "batcher"), (state["upstream"], "concat"),
                        (state["upstream"]["upstream"], "array_documents")):  # fmt: skip
        assert (level["format"], level["version"], level["kind"]) == (
            envelope.FORMAT, envelope.VERSION, kind,
        )  # fmt: skip


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s["upstream"].__setitem__("emitted", -1), "concat state: field 'emitted'"),
        (lambda s: s["upstream"].__setitem__("skip", "3"), "concat state: field 'skip'"),
        (lambda s: s.__setitem__("batches", True), "batcher state: field 'batches'"),
        (lambda s: s["upstream"]["upstream"].__setitem__("position", -5), "field 'position'"),
        (lambda s: s["upstream"]["upstream"].__setitem__("position", 10**6), "'position' is"),
        (lambda s: s["upstream"].pop("skip"), "field 'skip' is missing"),
        (lambda s: s["upstream"].__setitem__("extra", 1), "unknown field 'extra'"),
        (lambda s: s.__setitem__("kind", "shuffle"), "expected a batcher state, got a 'shuffle'"),
        (lambda s: s.__setitem__("version", 3), "version 3 was written by another"),
        (lambda s: s.__setitem__("format", "other"), "not a shardtok state"),
        (lambda s: s.__setitem__("upstream", [1, 2]), "field 'upstream' must be a state object"),
    ],
)
def test_damaged_states_are_refused_naming_the_field(edit, message):
    state = saved_after(concat_batcher, 3)
    edit(state)
    with pytest.raises(ResumeStateError, match=message):
        concat_batcher().reset(state)


def test_a_position_past_the_planned_batches_is_refused():
    state = saved_after(lambda: concat_batcher(num_batches=10), 3)
    state["batches"] = 11
    with pytest.raises(ResumeStateError, match="'batches' is 11, outside this stream"):
        concat_batcher(num_batches=10).reset(state)


def test_an_unenveloped_node_state_is_refused_naming_0_1():
    state = saved_after(concat_batcher, 3)
    legacy = {k: v for k, v in state.items() if k not in envelope.ENVELOPE}
    with pytest.raises(ResumeStateError, match=r"saved by shardtok 0\.1 \(it has no version\)"):
        concat_batcher().reset(legacy)


def test_greedy_references_are_checked():
    def make():
        return GreedyPacker(ArrayDocuments(docs()), 31, lookahead=4)

    state = saved_after(make, 4)
    assert state["open"], "the test needs an open sequence"
    bad = copy.deepcopy(state)
    bad["open"][0][0] = [state["position"] + 3, 0, 1]
    with pytest.raises(ResumeStateError, match="names document .* past the packer's position"):
        make().reset(bad)
    bad = copy.deepcopy(state)
    bad["open"][0][0] = [0, -1, 2]
    with pytest.raises(ResumeStateError, match="'open' must be a list of non-negative integers"):
        make().reset(bad)


def worker_state(rank=0, worker=0, num_workers=2, stream=None, epoch=0):
    placement = {"rank": rank, "world_size": 1, "worker": worker, "num_workers": num_workers}
    return envelope.wrap(
        "dataset", {"epoch": epoch, "placement": placement, "stream": stream, "fingerprint": {}}
    )


@pytest.mark.parametrize(
    "placement, message",
    [
        ({"rank": 0, "world_size": 1, "worker": 2, "num_workers": 2}, "not a valid layout"),
        ({"rank": 1, "world_size": 1, "worker": 0, "num_workers": 2}, "not a valid layout"),
        ({"rank": 0, "world_size": 1, "worker": -1, "num_workers": 2}, "'worker' must be >= 0"),
        ({"rank": 0, "world_size": 1, "worker": 0}, "field 'placement' must hold"),
    ],
)
def test_worker_state_placements_are_checked(placement, message):
    state = worker_state()
    state["placement"] = placement
    with pytest.raises(ResumeStateError, match=message):
        parse_saved(state)


def test_merge_refuses_a_missing_worker_and_a_duplicate():
    with pytest.raises(ResumeStateError, match=r"slices \[1\] .* are missing"):
        merge_states([worker_state(worker=0)])
    with pytest.raises(ResumeStateError, match="rank 0 worker 0 twice"):
        merge_states([worker_state(worker=0), worker_state(worker=0)])
    with pytest.raises(ResumeStateError, match="different epochs"):
        merge_states([worker_state(worker=0), worker_state(worker=1, epoch=1)])


def test_merged_state_round_trips_and_cannot_be_merged_again():
    merged = merge_states([worker_state(worker=0), worker_state(worker=1)])
    assert merged["kind"] == "merged" and len(merged["elastic"]["slices"]) == 2
    assert parse_saved(json.loads(json.dumps(merged))).to_dict() == merged
    with pytest.raises(ResumeStateError, match="cannot be merged again"):
        merge_states([merged])
