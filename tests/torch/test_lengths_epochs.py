"""``len()`` of ``ShardStreamDataset`` and ``ShardLoader`` (the batches a rank really gets), and
one dataset with ``num_batches`` through the loaders: epochs in order, exact and elastic resume."""

from __future__ import annotations

import json
import types
import warnings

import pytest
from torch.utils.data import DataLoader

from shardtok.errors import UsageError
from shardtok.stream.factory import StreamSetup
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, parse_saved
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardLoader, ShardStreamDataset, dataset_states
from shardtok.torch.transport import to_tensors
from tests.helpers.batches import assert_same, copies

OPTIONS = dict(seq_len=15, batch_size=2, shuffle_buffer=8, seed=6)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("lengths")
    out = []
    for i, size in enumerate((700, 500)):
        write_synthetic_dataset(root / f"d{i}", num_tokens=size, vocab_size=5000, mean_length=40,
                                shard_size=400, frame_size=200, seed=i)  # fmt: skip
        out.append(str(root / f"d{i}"))
    return out


def make(paths, kind: str, **kwargs) -> ShardStreamDataset:
    if kind == "mix":
        return ShardStreamDataset({paths[0]: 0.7, paths[1]: 0.3}, num_batches=7, **OPTIONS,
                                  **kwargs)  # fmt: skip
    if kind == "epochs":  # two and a bit epochs of one dataset
        return ShardStreamDataset(paths[0], num_batches=61, **OPTIONS, **kwargs)
    return ShardStreamDataset(paths[0], **OPTIONS, **kwargs)


@pytest.mark.parametrize("kind", ["single", "epochs", "mix"])
def test_len_is_what_a_rank_gets(paths, kind):
    ds = make(paths, kind)
    assert len(ds) == len(list(ds)) == len(list(ShardLoader(ds)))
    if kind == "epochs":
        assert len(ds) == 61 > ds.plan().batches_per_rank * 2
    ds = make(paths, kind, num_workers=2)
    loader = ShardLoader(ds, num_workers=2)
    got = list(loader)
    assert len(ds) == len(loader) == len(got) == len(list(DataLoader(ds, batch_size=None,
                                                                     num_workers=2)))  # fmt: skip
    assert len(ShardLoader(make(paths, kind), num_workers=2)) == len(got)  # exact for its own


def test_a_worker_count_len_did_not_count_for(paths, monkeypatch):
    with pytest.raises(UsageError, match="give both the same count"):
        ShardLoader(make(paths, "epochs", num_workers=3), num_workers=2)
    # As a DataLoader worker sees it (a real one would pay torch's 10 s shutdown after a
    # worker's exception).
    import shardtok.torch.dataset as module

    monkeypatch.setattr(module, "get_worker_info",
                        lambda: types.SimpleNamespace(id=0, num_workers=2))  # fmt: skip
    with pytest.raises(UsageError, match="pass num_workers=2"):
        next(iter(make(paths, "epochs", num_workers=1)))
    ds = make(paths, "epochs")  # without the hint: a warning once len() counted for 1 worker
    assert len(ds) == 61
    with pytest.warns(UserWarning, match="ShardLoader"):
        next(iter(ds))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iter(make(paths, "epochs")))  # len() never asked: nothing to warn about
        next(iter(make(paths, "epochs", num_workers=2)))


def streamed(paths, workers: int, resume=None) -> list[dict]:
    """The epochs stream's batches from its worker streams themselves, in round robin."""
    ds = make(paths, "epochs")
    setup = StreamSetup.single(ds.source, ds.options)
    k = max(workers, 1)
    local = -(-61 // k)
    streams = [
        setup.stream(Placement(0, 1, w, k), epoch=0, num_batches=local, resume=resume)
        for w in range(k)
    ]
    return [to_tensors(next(streams[s % k])) for s in range(local * k)]


@pytest.mark.parametrize("workers", [0, 2])
def test_num_batches_through_the_loader_resumes_exactly(paths, workers):
    want = copies(ShardLoader(make(paths, "epochs"), num_workers=workers))
    assert_same(want, streamed(paths, workers))
    per_epoch = make(paths, "epochs").plan(max(workers, 1)).batches_per_rank
    for stop in (per_epoch, per_epoch + per_epoch // 2):  # the boundary, the middle of epoch 1
        loader = ShardLoader(make(paths, "epochs"), num_workers=workers)
        it = iter(loader)
        got = copies(next(it) for _ in range(stop))
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        again = ShardLoader(make(paths, "epochs"), num_workers=workers)
        again.load_state_dict(state)
        assert_same(got + copies(again), want)


def test_elastic_resume_through_the_loader(paths):
    """2 workers save in epoch 1; a merge resumes with 1: epoch 1's rest, then epoch 2, ..."""
    loader = ShardLoader(make(paths, "epochs"), num_workers=2)
    it = iter(loader)
    per_epoch = make(paths, "epochs").plan(2).batches_per_rank
    copies(next(it) for _ in range(per_epoch + 5))
    merged = merge_states(json.loads(json.dumps(dataset_states(loader.state_dict()))))
    del it
    ds = make(paths, "epochs")
    ds.load_state_dict(merged)
    # The new layout's num_batches count from the resume's step on.
    assert_same(copies(ds), streamed(paths, 1, resume=parse_saved(merged)))
