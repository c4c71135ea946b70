"""Saved states mutated at random (numbers scaled, fields dropped, duplicated or retyped): each
is refused with a ResumeStateError, or resumes into exactly the batches the unmutated state
gives. Never a traceback of another kind, and never memory or time in proportion to a number."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.errors import ResumeStateError
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardStreamDataset

OPTIONS = dict(seq_len=31, batch_size=2, shuffle_buffer=16, seed=1)
MIX_OPTIONS = {**OPTIONS, "num_batches": 200}
# Numbers scaled only in these: a packer's, shuffle's or reader's position, or a mix source's
# epoch, scaled can be another valid position of the same stream, which resumes other batches
# (issue 36 leaves those cross-checks to a later change); every field anywhere is still dropped,
# duplicated and retyped.
SCALED_KINDS = ("slice_stream", "mixed_stream", "batcher", "mix_sequences")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_states")
    for name, size in (("a", 20_000), ("b", 6_000)):
        write_synthetic_dataset(root / name, num_tokens=size, vocab_size=1000, mean_length=50,
                                shard_size=4000, frame_size=1000)  # fmt: skip
    made = {}
    # curriculum stages that continue their sources: a then b, so a is parked in the state
    stages = {**OPTIONS, "data_stages": [
        {"name": "a", "data": {"dataset": {"dataset_path": str(root / "a")}}},
        {"name": "b", "start_training_step": 5, "data": {"dataset": {"dataset_path": str(root / "b")}}},
    ]}  # fmt: skip
    # a stage with its own seq_len: a is parked in 15-token rows, then packs its rest in 31
    resized = {**OPTIONS, "data_stages": [
        {"name": "a", "data": {"dataset": {"dataset_path": str(root / "a")}}},
        {"name": "b", "start_training_step": 4,
         "data": {"dataset": {"dataset_path": str(root / "b")}, "seq_len": 31}},
        {"name": "a+b", "start_training_step": 6, "data": {"seq_len": 31, "dataset": {
            "dataset_path": {str(root / "a"): 0.5, str(root / "b"): 0.5}}}},
    ]}  # fmt: skip
    for kind, make in (
        ("single", lambda: ShardStreamDataset(str(root / "a"), **OPTIONS)),
        ("mix", lambda: ShardStreamDataset({str(root / "a"): 0.7, str(root / "b"): 0.3}, **MIX_OPTIONS)),
        ("stages", lambda: ShardStreamDataset.from_config(stages, num_batches=200)),
        ("resized stages", lambda: ShardStreamDataset.from_config(resized, num_batches=200)),
    ):  # fmt: skip
        ds = make()
        it = iter(ds)
        for _ in range(7):
            next(it)
        state = json.loads(json.dumps(ds.state_dict()))
        made[kind] = (make, state, following(make, state))
    return made


def following(make, state, n=3):
    ds = make()
    ds.load_state_dict(state)
    it = iter(ds)
    return [next(it)["input_ids"].numpy().copy() for _ in range(n)]


def places(state, prefix=()):
    """Every (path, value) under the stream state, containers included."""
    if isinstance(state, dict):
        for key, value in state.items():
            yield (*prefix, key), value
            yield from places(value, (*prefix, key))
    elif isinstance(state, list):
        for i, value in enumerate(state):
            yield (*prefix, i), value
            yield from places(value, (*prefix, i))


def mutate(state, data):
    damaged = copy.deepcopy(state)
    spots = list(places(damaged["stream"]))
    path, value = spots[data.draw(st.integers(0, len(spots) - 1), label="spot")]
    holder = damaged["stream"]
    for key in path[:-1]:
        holder = holder[key]
    last = path[-1]
    how = data.draw(st.sampled_from(["scale", "drop", "duplicate", "retype"]), label="how")
    scalable = isinstance(holder, dict) and holder.get("kind") in SCALED_KINDS
    if how == "scale" and scalable and isinstance(value, int) and not isinstance(value, bool):
        holder[last] = value * 10 ** data.draw(st.integers(1, 12)) + data.draw(st.integers(0, 3))
    elif how == "drop" or how == "scale":
        if isinstance(holder, dict):
            del holder[last]
        else:
            holder.pop(last)
    elif how == "duplicate":
        if isinstance(holder, list):
            holder.insert(last, copy.deepcopy(value))
        else:
            holder[f"{last}_again"] = copy.deepcopy(value)
    else:
        holder[last] = data.draw(
            st.sampled_from([None, True, "7", 7.0, 1e300, [], {}, -1, [value]])
        )
    return damaged


@pytest.mark.parametrize("kind", ["single", "mix", "stages", "resized stages"])
# The same examples on every run: a failure here is never a fluke.
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_mutated_state_is_refused_or_resumes_exactly(cases, kind, data):
    make, state, expected = cases[kind]
    damaged = mutate(state, data)
    try:
        got = following(make, damaged)
    except ResumeStateError:
        return
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
