"""Class 13: a resume state is someone else's input too. Hand-edited positions, a loader state
missing a worker, a state of another kind or release: refused naming the field, never resumed
into other batches. (More cases: tests/stream/test_states.py, tests/torch/test_save_restore.py.)"""

from __future__ import annotations

import copy
import json

import pytest

from shardtok.errors import ResumeStateError
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardLoader, ShardStreamDataset

OPTIONS = dict(seq_len=31, batch_size=2, shuffle_buffer=16, seed=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("states")
    write_synthetic_dataset(path, num_tokens=20_000, vocab_size=1000, mean_length=50,
                            shard_size=4000, frame_size=1000)  # fmt: skip
    return path


def saved(data, batches=5):
    ds = ShardStreamDataset(data, **OPTIONS)
    it = iter(ds)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(ds.state_dict()))


def paths_to_ints(state, prefix=()):
    """Every (path, value) of an integer field anywhere in a state."""
    if isinstance(state, dict):
        for key, value in state.items():
            yield from paths_to_ints(value, (*prefix, key))
    elif isinstance(state, list):
        for i, value in enumerate(state):
            yield from paths_to_ints(value, (*prefix, i))
    elif isinstance(state, int) and not isinstance(state, bool):
        yield prefix, state


def test_a_negative_number_anywhere_is_refused(data):
    state = saved(data)
    fields = [p for p, _ in paths_to_ints(state["stream"])]
    assert len(fields) >= 10
    for path in fields:
        damaged = copy.deepcopy(state)
        holder = damaged["stream"]
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = -1
        with pytest.raises(ResumeStateError):
            ShardStreamDataset(data, **OPTIONS).load_state_dict(damaged)


def test_a_loader_state_without_a_worker_is_refused(data):
    loader = ShardLoader(ShardStreamDataset(data, **OPTIONS), num_workers=2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    state["workers"].pop()
    fresh = ShardLoader(ShardStreamDataset(data, **OPTIONS), num_workers=2)
    with pytest.raises(ResumeStateError, match="every worker's position is needed"):
        fresh.load_state_dict(state)


def test_a_state_of_another_kind_or_release_is_refused(data):
    state = saved(data)
    for edit, message in (
        (lambda s: s.__setitem__("kind", "loader"), "'loader' state"),
        (lambda s: s.__setitem__("version", 99), "version 99"),
        (lambda s: s["stream"].__setitem__("kind", "mixed_stream"), "mix"),
        (lambda s: s["stream"]["batcher"].pop("upstream"), "'upstream' is missing"),
    ):
        damaged = copy.deepcopy(state)
        edit(damaged)
        with pytest.raises(ResumeStateError, match=message):
            ShardStreamDataset(data, **OPTIONS).load_state_dict(damaged)
