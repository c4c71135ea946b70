"""Resume on another layout with one call: ``ShardLoader.load_state_dict`` (and the dataset's)
take every rank's loader state, or one rank's alone when it was the only rank, and continue by
the remainder rule -- the batches ``merge_states`` by hand gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardtok.errors import ResumeStateError
from shardtok.stream.resume.merge import dataset_states, merge_states
from shardtok.torch import ShardLoader, ShardStreamDataset
from tests.helpers.stages import write_sources

OPTIONS = dict(seq_len=15, batch_size=2, shuffle_buffer=8, seed=3, packing="concat")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("layout"))[0]


def old_run(path, world, workers, steps, **more):
    """Every rank's batches and ShardLoader state after `steps` steps."""
    batches, states = [], []
    for rank in range(world):
        ds = ShardStreamDataset(path, rank=rank, world_size=world, **{**OPTIONS, **more})
        loader = ShardLoader(ds, num_workers=workers, multiprocessing_context="fork")
        it = iter(loader)
        batches += [next(it) for _ in range(steps)]
        states.append(loader.state_dict())
        del it, loader
    return batches, states


def tokens(batches) -> np.ndarray:
    rows = [torch.cat([b["input_ids"], b["labels"][:, -1:]], 1).numpy() for b in batches]
    return np.concatenate(rows).ravel()


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(x[key], y[key]), key


def test_every_ranks_loader_state_in_one_call(path):
    """2 ranks x 2 workers saved; 1 rank x 3 workers loads their list: the batches of the
    documented merge_states path, no token twice."""
    before, states = old_run(path, 2, 2, 5)
    loader = ShardLoader(ShardStreamDataset(path, **OPTIONS), num_workers=3)
    loader.load_state_dict(states)
    length = len(loader)
    after = list(loader)
    assert length == len(after)  # the remainder's batches, not a fresh epoch's
    by_hand = ShardStreamDataset(path, **OPTIONS)
    by_hand.load_state_dict(merge_states(dataset_states(states)))
    same(after, list(ShardLoader(by_hand, num_workers=3)))
    seen = np.concatenate([tokens(before), tokens(after)])
    assert len(np.unique(seen)) == len(seen)
    # one rank's state of that layout alone is not the whole position: the refusal names the call
    lone = ShardLoader(ShardStreamDataset(path, **OPTIONS), num_workers=3)
    with pytest.raises(ResumeStateError, match=r"load_state_dict\(\[rank 0's, rank 1's"):
        lone.load_state_dict(states[0])


@pytest.mark.parametrize(
    ("workers", "more"), [(3, {}), (2, {"seq_len": 31}), (0, {"seq_len": 7, "batch_size": 3})]
)
def test_the_only_ranks_state_changes_workers_and_lengths_by_itself(path, workers, more):
    """A run of one rank holds every worker's position: its state resumes with other workers,
    another sequence length (and batch size), no list needed."""
    before, (state,) = old_run(path, 1, 2, 6)
    new = {**OPTIONS, **more}
    loader = ShardLoader(ShardStreamDataset(path, **new), num_workers=workers)
    loader.load_state_dict(state)
    length = len(loader)
    after = list(loader)
    assert length == len(after)  # the remainder's batches, not a fresh epoch's
    assert after and {tuple(b["input_ids"].shape) for b in after} == {
        (new["batch_size"], new["seq_len"])
    }
    by_hand = ShardStreamDataset(path, **new)
    by_hand.load_state_dict(merge_states(dataset_states(state)))
    same(after, list(ShardLoader(by_hand, num_workers=workers)))
    seen = np.concatenate([tokens(before), tokens(after)])
    assert len(np.unique(seen)) == len(seen)


def test_a_dataset_alone_changes_its_sequence_length(path):
    """In process (no workers, world size 1) the dataset's own state is all of it."""
    ds = ShardStreamDataset(path, **OPTIONS)
    it = iter(ds)
    before = [next(it) for _ in range(4)]
    longer = ShardStreamDataset(path, **{**OPTIONS, "seq_len": 40})
    longer.load_state_dict(ds.state_dict())
    after = list(longer)
    assert {b["input_ids"].shape[1] for b in after} == {40}
    seen = np.concatenate([tokens(before), tokens(after)])
    assert len(np.unique(seen)) == len(seen) and len(seen) > 3500
