"""ShardLoader: the DataLoader's batches in the DataLoader's order, resumable, and failing loudly."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardtok.errors import CorruptShardError, ResumeStateError
from shardtok.stream import merge_states
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import LoaderWorkerError, ShardLoader, ShardStreamDataset, dataset_states
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from tests.helpers.batches import assert_same, copies

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
OPTIONS = dict(seq_len=63, batch_size=4, shuffle_buffer=40, seed=5)


@pytest.fixture
def dataset(torch_stream_dataset):
    return torch_stream_dataset


def reference(path, num_workers, epoch=0, **overrides):
    ds = ShardStreamDataset(path, **{**OPTIONS, **overrides})
    ds.set_epoch(epoch)
    return copies(DataLoader(ds, batch_size=None, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_same_batches_in_the_same_order_as_the_dataloader(dataset, num_workers):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=num_workers)
    assert loader.lean == (num_workers > 0)
    assert_same(copies(loader), reference(dataset, num_workers))


def test_a_worker_that_has_finished_drops_out_of_the_rotation(dataset):
    """As in the DataLoader, a worker without batches is skipped and the others go on."""
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    it = iter(loader)
    for _ in range(5):  # worker 0 gave 3 batches, worker 1 two; worker 1 is next
        next(it)
    state = loader.state_dict()
    it.close()
    assert state["next_worker"] == 1
    finished = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    list(finished)
    state["workers"][1] = finished.state_dict()["workers"][1]  # worker 1 at its end
    resumed = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    resumed.load_state_dict(state)
    assert_same(copies(resumed), reference(dataset, 2)[6::2])  # the rest of worker 0, alone


def test_a_weighted_mix_gives_the_dataloader_batches_and_resumes(dataset, tmp_path):
    other = tmp_path / "other"
    write_synthetic_dataset(other, num_tokens=20_000, vocab_size=70_000, mean_length=80,
                            shard_size=7_000, frame_size=3000, seed=4)  # fmt: skip

    def mix():
        return ShardStreamDataset({str(dataset): 0.7, str(other): 0.3}, **OPTIONS, num_batches=30)

    want = copies(DataLoader(mix(), batch_size=None, num_workers=2))
    loader = ShardLoader(mix(), num_workers=2)
    it = iter(loader)
    first = copies(next(it) for _ in range(11))
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    resumed = ShardLoader(mix(), num_workers=2)
    resumed.load_state_dict(state)
    assert len(want) == 30
    assert_same(first + copies(resumed), want)


@pytest.mark.parametrize("stop_at", [0, 1, 6, 17])
def test_state_dict_resumes_exactly(dataset, stop_at):
    full = reference(dataset, 2, packing="greedy")
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS, packing="greedy"), num_workers=2)
    it = iter(loader)
    first = copies(next(it) for _ in range(stop_at))
    state = json.loads(json.dumps(loader.state_dict()))  # plain data
    it.close()
    assert len(json.dumps(state)) < 8000
    resumed = ShardLoader(ShardStreamDataset(dataset, **OPTIONS, packing="greedy"), num_workers=2)
    resumed.load_state_dict(state)
    assert_same(first + copies(resumed), full)


def test_state_at_the_end_of_an_epoch_resumes_to_nothing(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    assert len(list(loader)) > 0
    resumed = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    assert list(resumed) == []


def test_a_state_saved_after_set_epoch_starts_that_epoch(dataset):
    ds = ShardStreamDataset(dataset, **OPTIONS)
    loader = ShardLoader(ds, num_workers=2, persistent_workers=True)
    list(loader)
    ds.set_epoch(1)
    state = loader.state_dict()
    assert {w["epoch"] for w in state["workers"]} == {1}
    resumed = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    resumed.load_state_dict(state)
    assert_same(copies(resumed), reference(dataset, 2, epoch=1))


def test_in_process_state_round_trip(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=0)
    it = iter(loader)
    first = copies(next(it) for _ in range(3))
    resumed = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=0)
    resumed.load_state_dict(loader.state_dict())
    assert_same(first + copies(resumed), reference(dataset, 0))


def test_another_worker_count_resumes_by_merge_states(tmp_path):
    """The only rank's loader state holds every worker's position: another worker count loads
    it by the remainder rule, exactly what merge_states by hand gives (one rank of several is
    refused: tests/torch/test_layout_resume.py)."""
    path = tmp_path / "unique"
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 300, size=400)]
    write_synthetic_dataset(path, lengths=lengths, vocab_size=1 << 24, unique_tokens=True,
                            first_token=1, shard_size=9000, frame_size=2000)  # fmt: skip
    loader = ShardLoader(ShardStreamDataset(path, **OPTIONS), num_workers=2)
    it = iter(loader)
    seen = copies(next(it) for _ in range(6))
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    three = ShardLoader(ShardStreamDataset(path, **OPTIONS), num_workers=3)
    three.load_state_dict(state)
    ds = ShardStreamDataset(path, **OPTIONS)
    ds.load_state_dict(merge_states(dataset_states(state)))
    rest = copies(ShardLoader(ds, num_workers=3))
    for a, b in zip(copies(three), rest, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])

    def tokens(batches):  # each row's inputs and its last target; tokens are unique positions
        rows = [torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1) for b in batches]
        return torch.cat([r.ravel() for r in rows]).numpy()

    got = np.concatenate([tokens(seen), tokens(rest)])
    assert len(np.unique(got)) == len(got), "a token was read twice"
    leftover = sum(lengths) - len(got)  # each slice's last partial window (as any epoch)
    assert 0 <= leftover < 5 * (OPTIONS["batch_size"] + 1) * (OPTIONS["seq_len"] + 1)


def test_a_refused_fingerprint(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    state = loader.state_dict()
    other = ShardLoader(ShardStreamDataset(dataset, **{**OPTIONS, "seed": 6}), num_workers=2)
    with pytest.raises(ResumeStateError):
        other.load_state_dict(state)


def test_persistent_workers_follow_set_epoch_and_survive_a_break(dataset):
    ds = ShardStreamDataset(dataset, **OPTIONS)
    loader = ShardLoader(ds, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it), next(it)  # abandoned mid-epoch: the workers stop and wait
    pids = [p.pid for p in it.workers.processes]
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert_same(copies(loader), reference(dataset, 2, epoch=epoch))
        assert [p.pid for p in loader._workers.processes] == pids


def test_workers_exit_when_an_epoch_is_abandoned(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2)
    it = iter(loader)
    next(it)
    processes = list(it.workers.processes)
    it.close()
    assert not any(p.is_alive() for p in processes)
    del it, loader


def test_batches_held_past_the_ring_come_through_ordinary_memory(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=1, prefetch=2)
    held = list(loader)  # every batch kept: the ring (6 slots) runs out
    assert len(held) > 6
    assert_same(held, reference(dataset, 1))


def test_a_worker_error_is_raised_with_its_type_and_traceback(tmp_path):
    path = tmp_path / "ds"
    write_synthetic_dataset(path, num_tokens=30_000, vocab_size=1000, mean_length=100,
                            shard_size=10_000, frame_size=2000)  # fmt: skip
    shard = sorted(path.glob("*.tar"))[1]
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff" * 64  # inside some frame of the token member
    shard.write_bytes(bytes(data))
    loader = ShardLoader(
        ShardStreamDataset(path, **{**OPTIONS, "shuffle_buffer": 0}), num_workers=2
    )
    with pytest.raises(CorruptShardError) as raised:
        list(loader)
    assert "ShardLoader worker" in "".join(raised.value.__notes__)
    assert shard.name in str(raised.value)


def test_a_killed_worker_is_reported(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=2, prefetch=1)
    it = iter(loader)
    next(it)
    victim = it.workers.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    with pytest.raises(LoaderWorkerError, match=rf"worker 1 \(pid {victim.pid}\) exited"):
        for _ in it:
            pass


def test_a_worker_silent_past_the_timeout_is_reported(dataset):
    loader = ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=1, prefetch=1,
                         timeout=0.5)  # fmt: skip
    it = iter(loader)
    next(it)
    worker = it.workers.processes[0]
    assert it.workers.results[0].poll(10)  # the one batch its credit allows is ready
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        next(it)
        with pytest.raises(LoaderWorkerError, match=r"worker 0 .* sent no batch in 0.5 s"):
            next(it)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the loader killed it
            os.kill(worker.pid, signal.SIGCONT)
    assert not worker.is_alive()
    assert_same(copies(loader), reference(dataset, 1))  # a fresh worker serves the next epoch


def test_only_a_shard_stream_dataset_is_accepted(dataset):
    with pytest.raises(TypeError, match="ShardStreamDataset or a MemmapTokenDataset"):
        ShardLoader([1, 2, 3], num_workers=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefetch"):
        ShardLoader(ShardStreamDataset(dataset, **OPTIONS), num_workers=1, prefetch=0)


# -- the memmap path ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain-loader")
    write_synthetic_dataset(
        path, num_tokens=40_000, vocab_size=100_000, mean_length=120, shard_size=9000,
        frame_size=3000, compression_level=None,
    )  # fmt: skip
    return path


def memmap(path, **kwargs):
    return MemmapTokenDataset(path, seq_len=31, num_samples=203, seed=2, **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_memmap_batches_equal_the_dataloader(plain, num_workers, drop_last):
    """Batch b comes from worker b % K, as the DataLoader deals them; the last batch is short
    unless drop_last, and workers end one batch apart."""
    ds = memmap(plain)
    want = copies(DataLoader(ds, batch_size=4, collate_fn=ds.collate, drop_last=drop_last,
                             num_workers=num_workers))  # fmt: skip
    got = copies(ShardLoader(memmap(plain), batch_size=4, num_workers=num_workers,
                             drop_last=drop_last))  # fmt: skip
    assert len(want) == (len(ds) // 4 if drop_last else -(-len(ds) // 4))
    assert_same(got, want)


def test_memmap_with_a_distributed_sampler_and_resume(plain):
    from torch.utils.data.distributed import DistributedSampler

    def sampler(ds):
        s = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
        s.set_epoch(4)
        return s

    ds = memmap(plain)
    want = copies(DataLoader(ds, batch_size=4, sampler=sampler(ds), collate_fn=ds.collate,
                             num_workers=2))  # fmt: skip
    ds = memmap(plain)
    loader = ShardLoader(ds, batch_size=4, sampler=sampler(ds), num_workers=2)
    it = iter(loader)
    first = copies(next(it) for _ in range(7))
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    assert state["workers"] == [{"taken": 4}, {"taken": 3}] and state["next_worker"] == 1
    ds = memmap(plain)
    resumed = ShardLoader(ds, batch_size=4, sampler=sampler(ds), num_workers=2)
    resumed.load_state_dict(state)
    assert_same(first + copies(resumed), want)
    other = ShardLoader(memmap(plain), batch_size=8, num_workers=2)
    with pytest.raises(ResumeStateError, match="memmap batches"):
        other.load_state_dict(state)


class _FreezeProbe(MemmapTokenDataset):
    """Writes, from each worker's first plan, how many objects its collections skip."""

    probe_dir = ""

    def plan(self, indices, sizes):
        probe = Path(self.probe_dir) / str(os.getpid())
        if not probe.exists():
            probe.write_text(str(gc.get_freeze_count()))
        return super().plan(indices, sizes)


def test_forked_workers_leave_what_they_inherit_out_of_their_collections(plain, tmp_path):
    """A collection in a forked worker would copy the pages of every object it examines; the
    objects inherited from this process are frozen there instead (see _worker_main)."""
    ds = _FreezeProbe(plain, seq_len=31, num_samples=203, seed=2)
    ds.probe_dir = str(tmp_path)
    inherited = len(gc.get_objects())
    loader = ShardLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    batches = iter(loader)
    next(batches), next(batches)  # batch b comes from worker b % 2: both have planned
    del batches
    counts = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(counts) == 2
    assert min(counts) >= inherited // 2, (counts, inherited)
    assert gc.get_freeze_count() == 0  # this process's collections are untouched


def test_memmap_in_process_resume(plain):
    want = copies(ShardLoader(memmap(plain), batch_size=4))
    loader = ShardLoader(memmap(plain), batch_size=4)
    it = iter(loader)
    first = copies(next(it) for _ in range(5))
    resumed = ShardLoader(memmap(plain), batch_size=4)
    resumed.load_state_dict(loader.state_dict())
    assert_same(first + copies(resumed), want)


def test_loader_arguments_that_do_not_fit_the_dataset(dataset, plain):
    with pytest.raises(ValueError, match="batch_size"):
        ShardLoader(memmap(plain), num_workers=1)
    with pytest.raises(ValueError, match="builds its own batches"):
        ShardLoader(ShardStreamDataset(dataset, **OPTIONS), batch_size=4)
