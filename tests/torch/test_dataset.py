"""The PyTorch streaming dataset under DataLoader: same batches as the torch-free stream."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.torch import ShardStreamDataset
from shardtok.torch.distributed import data_parallel_rank
from tests.helpers.batches import check_model_keys

OPTIONS = dict(seq_len=63, batch_size=4, shuffle_buffer=40, seed=5)


@pytest.fixture
def dataset(torch_stream_dataset):
    return torch_stream_dataset


def expected(path, num_workers, epoch=0, rank=0, world_size=1, **overrides):
    """DataLoader order: round-robin over workers, each yielding its slice's batches."""
    options = StreamOptions(**{**OPTIONS, **overrides})
    per_worker = [
        take(
            SliceStream(
                path, options, epoch=epoch, rank=rank, world_size=world_size,
                worker=w, num_workers=max(num_workers, 1),
            ),
            None,
        )
        for w in range(max(num_workers, 1))
    ]  # fmt: skip
    lengths = {len(b) for b in per_worker}
    assert len(lengths) == 1
    return [
        per_worker[i % len(per_worker)][i // len(per_worker)]
        for i in range(sum(map(len, per_worker)))
    ]


def assert_same(batches, reference):
    assert len(batches) == len(reference)
    for got, want in zip(batches, reference):
        got = check_model_keys(got)
        assert set(got) == set(want)
        for key, value in want.items():
            if isinstance(value, np.ndarray):
                assert isinstance(got[key], torch.Tensor)
                assert got[key].dtype == torch.from_numpy(value).dtype
                assert np.array_equal(got[key].numpy(), value), key
            else:
                assert got[key] == value


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_dataloader_yields_the_planned_batches(dataset, num_workers):
    ds = ShardStreamDataset(dataset, **OPTIONS)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    batches = list(loader)  # all held at once: more than the shared-memory ring has slots
    assert len(batches) == ds.batches_per_rank(num_workers) > 16
    assert_same(batches, expected(dataset, num_workers))


def test_persistent_workers_follow_set_epoch(dataset):
    ds = ShardStreamDataset(dataset, **OPTIONS)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        got = [
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
            for b in loader
        ]
        assert_same(got, expected(dataset, 2, epoch=epoch))


def test_pin_memory_and_greedy_packing(dataset):
    ds = ShardStreamDataset(dataset, **OPTIONS, packing="greedy", world_size=2, rank=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-only torch warns that nothing can be pinned
        loader = DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True)
        batches = list(loader)
    assert_same(batches, expected(dataset, 2, rank=1, world_size=2, packing="greedy"))


def test_batches_survive_slot_reuse(dataset):
    """A batch kept while the worker streams on is never overwritten by later batches."""
    ds = ShardStreamDataset(dataset, **OPTIONS)
    reference = expected(dataset, 1)
    kept = {}
    for i, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=1)):
        if i % 5 == 0:
            kept[i] = batch["input_ids"][1:3, 5:]  # a view keeps the slot alive
    for i, view in kept.items():
        assert np.array_equal(view.numpy(), reference[i]["input_ids"][1:3, 5:])


def test_resume_in_process(dataset):
    reference = expected(dataset, 0)
    ds = ShardStreamDataset(dataset, **OPTIONS)
    it = iter(ds)
    first = [next(it) for _ in range(7)]
    state = ds.state_dict()
    again = ShardStreamDataset(dataset, **OPTIONS)
    again.load_state_dict(state)
    assert_same(first + list(again), reference)


def test_data_parallel_rank_arguments():
    assert data_parallel_rank(None, None) == (0, 1)
    assert data_parallel_rank(2, 4) == (2, 4)
    with pytest.raises(ValueError):
        data_parallel_rank(2, None)
    with pytest.raises(ValueError):
        data_parallel_rank(4, 4)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(dataset, num_workers):
    """torchdata's StatefulDataLoader drives state_dict()/load_state_dict() inside workers."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader():
        return StatefulDataLoader(
            ShardStreamDataset(dataset, **OPTIONS, packing="greedy"),
            batch_size=None,
            num_workers=num_workers,
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata's own deprecation notices
        reference = [b["input_ids"].clone() for b in loader()]
        first_loader = loader()
        it = iter(first_loader)
        first = [next(it)["input_ids"].clone() for _ in range(9)]
        state = first_loader.state_dict()
        resumed = loader()
        resumed.load_state_dict(state)
        rest = [b["input_ids"].clone() for b in resumed]
    assert len(first) + len(rest) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(first + rest, reference))


def test_rank_comes_from_torch_distributed_when_initialised(dataset):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        assert data_parallel_rank(None, None) == (0, 1)
        assert data_parallel_rank(3, 4) == (3, 4)  # explicit (data-parallel) ranks still win
        ds = ShardStreamDataset(dataset, **OPTIONS)
        assert ds.plan(2).world_size == 1
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("loader", ["dataloader", "shardloader"])
def test_dataset_state_in_the_main_process_while_workers_stream_is_refused(dataset, loader):
    """Lightning-style `ds.state_dict()` with workers: never a silent restart at batch 0."""
    from shardtok.errors import ResumeStateError
    from shardtok.torch import ShardLoader

    ds = ShardStreamDataset(dataset, **OPTIONS)
    if loader == "dataloader":
        it = iter(DataLoader(ds, batch_size=None, num_workers=2))
    else:
        it = iter(ShardLoader(ds, num_workers=2))
    next(it)
    with pytest.raises(ResumeStateError, match="position lives in the workers. Checkpoint the"):
        ds.state_dict()
    del it
    # in process the dataset holds its own position, and a state loaded in the main process
    # is its position until the next iteration
    single = ShardStreamDataset(dataset, **OPTIONS)
    batches = iter(single)
    next(batches)
    state = single.state_dict()
    assert state["kind"] == "dataset" and state["stream"]["batcher"]["batches"] == 1
    ds.load_state_dict(state)
    assert ds.state_dict() == state
