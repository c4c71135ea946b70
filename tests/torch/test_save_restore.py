"""The shared save/restore checker run on ShardStreamDataset and ShardLoader: N batches equal k +
restore + (N - k) at every midpoint, a restore at the end of the epoch, and the epoch after a
restore equal to the uninterrupted one's."""

from __future__ import annotations

import json

import pytest

from shardtok.testing.save_restore import EpochRunner, check_save_restore
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import MemmapTokenDataset, ShardLoader, ShardStreamDataset

OPTIONS = dict(seq_len=63, batch_size=4, shuffle_buffer=64, seed=5)
MIDPOINTS = (0, 1, 5, 17, -1)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Two small datasets: about 40 batches of 4 x 64 tokens per epoch in one process."""
    paths = []
    for i in range(2):
        path = tmp_path_factory.mktemp(f"save-restore-{i}")
        write_synthetic_dataset(
            path, num_tokens=10_000, vocab_size=50_000, mean_length=90, shard_size=3000,
            frame_size=1000, seed=i, compression_level=None if i else 3,
        )  # fmt: skip
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_dataset_in_process(small, packing):
    check_save_restore(
        lambda: EpochRunner(ShardStreamDataset(small[0], packing=packing, **OPTIONS)),
        MIDPOINTS,
        next_epoch=EpochRunner.next_epoch,
    )


def test_mixed_dataset_in_process(small):
    def make():
        ds = ShardStreamDataset({small[0]: 2, small[1]: 1}, num_batches=30, **OPTIONS)
        return EpochRunner(ds)

    check_save_restore(make, MIDPOINTS, next_epoch=EpochRunner.next_epoch)


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_loader_with_two_workers(small, packing):
    def make():
        ds = ShardStreamDataset(small[0], packing=packing, **OPTIONS)
        return EpochRunner(ShardLoader(ds, num_workers=2, multiprocessing_context="fork"), ds)

    check_save_restore(make, MIDPOINTS, next_epoch=EpochRunner.next_epoch)


def test_memmap_loader_with_two_workers(small):
    def make():
        ds = MemmapTokenDataset(small[1], seq_len=31, num_samples=90, seed=2)
        return EpochRunner(ShardLoader(ds, batch_size=4, num_workers=2))

    check_save_restore(make, MIDPOINTS, next_epoch=lambda runner: runner.reset(None))


def test_damaged_loader_states_are_refused(small):
    """A loader state with a worker removed would silently drop that worker's share."""
    from shardtok.errors import ResumeStateError

    ds = ShardStreamDataset(small[0], **OPTIONS)
    loader = ShardLoader(ds, num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    cases = {
        "one worker removed": (lambda s: s["workers"].pop(), "every worker's position"),
        "next_worker out of range": (lambda s: s.__setitem__("next_worker", 2), "next_worker"),
        "workers swapped": (lambda s: s["workers"].reverse(), r"workers\[0\] holds worker 1"),
        "negative position": (
            lambda s: s["workers"][0]["stream"]["batcher"].__setitem__("batches", -1),
            "field 'batches' must be a non-negative integer",
        ),
        "another kind": (lambda s: s.__setitem__("kind", "memmap_loader"), "expected a loader"),
    }
    for edit, message in cases.values():
        damaged = json.loads(json.dumps(state))
        edit(damaged)
        fresh = ShardLoader(ShardStreamDataset(small[0], **OPTIONS), num_workers=2)
        with pytest.raises(ResumeStateError, match=message):  # at load, not in a worker later
            fresh.load_state_dict(damaged)
