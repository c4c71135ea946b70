"""ShardLoader under every start method: fork, forkserver and spawn give the DataLoader's batches
and resume exactly from a saved state.

Spawned and forkserver workers import this module's objects by reference, so the datasets here
are made from paths and plain arguments only. Each method's runs share module-scoped data.
"""

from __future__ import annotations

import json

import pytest
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardLoader, ShardStreamDataset
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from tests.helpers.batches import assert_same, copies

METHODS = ["fork", "forkserver", "spawn"]
OPTIONS = dict(seq_len=63, batch_size=4, shuffle_buffer=40, seed=5)


def whole_and_resumed(make_loader, stop_at: int):
    """One loader's whole epoch, its state saved after `stop_at` batches along the way; and those
    `stop_at` batches followed by the rest from a new loader given that state. (One worker pool
    for both the uninterrupted run and the save: a spawned pool costs 1-2 s.)"""
    loader = make_loader()
    it = iter(loader)
    first = copies(next(it) for _ in range(stop_at))
    state = json.loads(json.dumps(loader.state_dict()))  # plain data
    whole = first + copies(it)
    resumed = make_loader()
    resumed.load_state_dict(state)
    return whole, first + copies(resumed), state


# -- the streaming path ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def stream_reference(torch_stream_dataset):
    """Epochs 0 and 1 as a forked DataLoader with two workers yields them."""
    out = {}
    for epoch in (0, 1):
        ds = ShardStreamDataset(torch_stream_dataset, **OPTIONS)
        ds.set_epoch(epoch)
        out[epoch] = copies(DataLoader(ds, batch_size=None, num_workers=2))
    return out


@pytest.mark.parametrize("method", METHODS)
def test_the_dataloader_batches_under_each_start_method(
    torch_stream_dataset, stream_reference, method
):
    """The DataLoader's batches under `method` are the forked DataLoader's; ShardLoader's under
    each method are compared with those below."""
    ds = ShardStreamDataset(torch_stream_dataset, **OPTIONS)
    got = copies(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=method))
    assert len(got) > 20
    assert_same(got, stream_reference[0])


@pytest.mark.parametrize("method", METHODS)
def test_the_dataloaders_batches_and_an_exact_resume_under_each_start_method(
    torch_stream_dataset, stream_reference, method
):
    def make():
        ds = ShardStreamDataset(torch_stream_dataset, **OPTIONS)
        return ShardLoader(ds, num_workers=2, multiprocessing_context=method)

    whole, resumed, state = whole_and_resumed(make, stop_at=7)
    assert state["num_workers"] == 2 and state["next_worker"] == 1
    assert_same(whole, stream_reference[0])
    assert_same(resumed, stream_reference[0])


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_persistent_workers_follow_set_epoch_under_each_start_method(
    torch_stream_dataset, stream_reference, method
):
    """The epoch lives in shared memory that a spawned worker receives at its start."""
    ds = ShardStreamDataset(torch_stream_dataset, **OPTIONS)
    loader = ShardLoader(ds, num_workers=2, persistent_workers=True,
                         multiprocessing_context=method)  # fmt: skip
    assert_same(copies(loader), stream_reference[0])
    pids = [p.pid for p in loader._workers.processes]
    ds.set_epoch(1)
    assert_same(copies(loader), stream_reference[1])
    assert [p.pid for p in loader._workers.processes] == pids


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_without_shared_memory_batches_are_pickled_and_still_resume(
    torch_stream_dataset, stream_reference, method
):
    def make():
        ds = ShardStreamDataset(torch_stream_dataset, **OPTIONS, shared_memory=False)
        return ShardLoader(ds, num_workers=2, multiprocessing_context=method)

    assert not make().zero_copy
    whole, resumed, _ = whole_and_resumed(make, stop_at=5)
    assert_same(whole, stream_reference[0])
    assert_same(resumed, stream_reference[0])


# -- the memmap path -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain-start-methods")
    write_synthetic_dataset(
        path, num_tokens=40_000, vocab_size=100_000, mean_length=120, shard_size=9000,
        frame_size=3000, compression_level=None,
    )  # fmt: skip
    return path


def memmap_loader(path, num_workers: int, method: str | None = None) -> ShardLoader:
    ds = MemmapTokenDataset(path, seq_len=31, num_samples=203, seed=2)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(4)
    return ShardLoader(ds, batch_size=4, sampler=sampler, num_workers=num_workers,
                       multiprocessing_context=method)  # fmt: skip


@pytest.fixture(scope="module")
def memmap_reference(plain):
    """In process: the memmap batches do not depend on the number of workers."""
    ds = MemmapTokenDataset(plain, seq_len=31, num_samples=203, seed=2)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(4)
    want = copies(DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=ds.collate))
    assert_same(copies(memmap_loader(plain, 0)), want)
    return want


@pytest.mark.parametrize("method", METHODS)
def test_memmap_batches_and_resume_under_each_start_method(plain, memmap_reference, method):
    whole, resumed, state = whole_and_resumed(lambda: memmap_loader(plain, 2, method), stop_at=7)
    assert state["workers"] == [{"taken": 4}, {"taken": 3}] and state["next_worker"] == 1
    assert_same(whole, memmap_reference)
    assert_same(resumed, memmap_reference)
