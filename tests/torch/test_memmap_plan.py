"""Planned memmap batches (``BatchPlan``, what ``ShardLoader`` and ``__getitems__`` build) are
byte for byte the batches built the previous ways: sample by sample (``build_batch`` of
``sequence(i)``) and one batch at a time (``GPTSamples.gather`` + ``assemble_contiguous_batch``),
for every labels option, with loss masks, across documents and shard boundaries, in process and
in workers."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.errors import CorruptShardError
from shardtok.format import write_megatron_pair
from shardtok.format.shard_reader import ShardReader
from shardtok.stream.batch import assemble_contiguous_batch, build_batch
from shardtok.stream.masked import flag_untrained
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardLoader
from shardtok.torch.loader.memmap_batches import MemmapBatches
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from shardtok.torch.memmap_plan import BatchPlan
from tests.helpers.batches import check_model_keys

OPTIONS = [
    dict(mask_boundary_labels=False, labels_format="shifted"),
    dict(mask_boundary_labels=True, labels_format="shifted"),
    dict(mask_boundary_labels=False, labels_format="hf"),
    dict(mask_boundary_labels=True, labels_format="hf"),
]


def as_numpy(batch: dict) -> dict:
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def assert_equal(got: dict, want: dict, where: str = "") -> None:
    got, want = as_numpy(check_model_keys(got)), as_numpy(check_model_keys(want))
    assert set(got) == set(want), where
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            assert got[key].dtype == value.dtype, (where, key)
            assert np.array_equal(got[key], value), (where, key)
        else:
            # (a batch that travels pickled from a worker carries its scalars as 0-d tensors)
            assert int(got[key]) == value, (where, key)


def per_sample(ds: MemmapTokenDataset, indices) -> dict:
    """The batch built sample by sample, the slowest and plainest way."""
    return build_batch([ds.sequence(int(i)) for i in indices],
                       mask_boundary_labels=ds.mask_boundary_labels,
                       labels_format=ds.labels_format)  # fmt: skip


def one_batch(ds: MemmapTokenDataset, indices) -> dict:
    """The batch built by the previous one-batch-at-a-time path."""
    samples = ds.samples
    if samples.masks is None:
        tokens, boundaries = samples.gather(list(indices))
    else:
        tokens, boundaries, mask = samples.gather_with_masks(list(indices))
        tokens = flag_untrained(tokens, mask)
    return assemble_contiguous_batch(
        tokens, boundaries, len(indices), mask_boundary_labels=ds.mask_boundary_labels,
        labels_format=ds.labels_format, masked=samples.masks is not None,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    seq_len=st.integers(2, 16),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    picks=st.data(),
    option=st.sampled_from(OPTIONS),
    masked=st.booleans(),
)
def test_a_plan_equals_building_batch_by_batch_and_sample_by_sample(
    tmp_path_factory, lengths, seq_len, sizes, picks, option, masked
):
    if sum(lengths) <= seq_len + 1:
        return
    docs = [np.arange(n, dtype=np.uint16) + 7 * k for k, n in enumerate(lengths)]
    prefix = tmp_path_factory.mktemp("pair") / "pair"
    write_megatron_pair(prefix, docs, np.uint16)
    if masked:  # the loss masks export-megatron --mask writes beside the tokens
        rng = np.random.default_rng(sum(lengths))
        write_megatron_pair(f"{prefix}_mask", [rng.integers(0, 2, n, dtype=np.uint8)
                                               for n in lengths], np.uint8)  # fmt: skip
    ds = MemmapTokenDataset(prefix, seq_len=seq_len, num_samples=50, seed=3,
                            shared_memory=False, **option)  # fmt: skip
    assert ds.masked == masked
    count = sum(sizes)
    indices = picks.draw(st.lists(st.integers(-len(ds), len(ds) - 1), min_size=count,
                                  max_size=count))  # fmt: skip
    plan = ds.plan(np.array(indices), sizes)
    at = 0
    for j, size in enumerate(sizes):
        rows = indices[at : at + size]
        at += size
        got = plan.batch(j)
        assert_equal(got, one_batch(ds, rows), f"batch {j}")
        assert_equal(got, per_sample(ds, [i % len(ds) for i in rows]), f"batch {j}")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Uncompressed shards of ~1,200 tokens and 100-token frames: a 64-token sample spans
    documents, frames and shards."""
    path = tmp_path_factory.mktemp("shards")
    manifest = write_synthetic_dataset(
        path, num_tokens=30_000, vocab_size=50_000, mean_length=40, shard_size=5000,
        frame_size=400, compression_level=None,
    )  # fmt: skip
    assert len(manifest.shards) > 10
    return path


def spans_a_shard_boundary(ds: MemmapTokenDataset, i: int) -> bool:
    pieces = ds.samples.document_boundaries(i)
    shard_of = np.searchsorted(ds.samples.tokens.bounds, ds.samples.document_starts, "right")
    return len(set(shard_of[pieces.document_ids[pieces.lengths > 0]].tolist())) > 1


@pytest.mark.parametrize("option", OPTIONS)
def test_planned_batches_of_shards_equal_the_previous_ways(shards, option):
    ds = MemmapTokenDataset(shards, seq_len=63, num_samples=600, seed=5, shared_memory=False,
                            **option)  # fmt: skip
    assert any(spans_a_shard_boundary(ds, i) for i in range(len(ds)))
    order = np.random.default_rng(1).permutation(len(ds))
    sizes = [8] * (len(ds) // 8) + ([len(ds) % 8] if len(ds) % 8 else [])
    plan = ds.plan(order, sizes)
    for j in range(len(plan)):
        rows = order[8 * j : 8 * j + sizes[j]]
        got = plan.batch(j)
        assert_equal(got, one_batch(ds, rows.tolist()), f"batch {j}")
        if j % 5 == 0:
            assert_equal(got, per_sample(ds, rows), f"batch {j}")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("run", [1, 3, 32])
def test_loader_batches_equal_the_per_sample_batches(shards, num_workers, run, monkeypatch):
    """Whatever the run of batches planned together, in process or in (forked) workers."""
    monkeypatch.setattr(MemmapBatches, "RUN", run)
    ds = MemmapTokenDataset(shards, seq_len=63, num_samples=300, seed=5, mask_boundary_labels=True)
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(2))
    loader = ShardLoader(ds, batch_size=8, sampler=sampler, num_workers=num_workers)
    order = list(torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(2)))
    batches = [as_numpy({k: v.clone() if isinstance(v, torch.Tensor) else v
                         for k, v in b.items()}) for b in loader]  # fmt: skip
    assert len(batches) == -(-len(ds) // 8)
    reference = MemmapTokenDataset(shards, seq_len=63, num_samples=300, seed=5,
                                   mask_boundary_labels=True, shared_memory=False)  # fmt: skip
    for j, batch in enumerate(batches):
        assert_equal(batch, per_sample(reference, order[8 * j : 8 * j + 8]), f"batch {j}")


def test_a_resume_inside_a_planned_run(shards, monkeypatch):
    monkeypatch.setattr(MemmapBatches, "RUN", 4)

    def loader():
        ds = MemmapTokenDataset(shards, seq_len=63, num_samples=300, seed=5)
        return ShardLoader(ds, batch_size=8, num_workers=0)

    whole = [as_numpy(b)["input_ids"].copy() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)["input_ids"].numpy().copy() for _ in range(6)]  # mid-way through run 2
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    rest = [b["input_ids"].numpy().copy() for b in resumed]
    assert len(head) + len(rest) == len(whole)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, whole))


def test_a_damaged_frame_is_refused_when_its_batches_are_planned(shards, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(shards, damaged)
    shard = sorted(damaged.glob("*.tar"))[1]
    offset = ShardReader(shard).head.bin_header.data_offset + 10
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0x40
    shard.write_bytes(bytes(data))
    ds = MemmapTokenDataset(damaged, seq_len=63, num_samples=300, seed=5)
    with pytest.raises(CorruptShardError, match=rf"{shard.name}.*crc32"):
        for _ in ShardLoader(ds, batch_size=8):
            pass


def test_plan_arguments():
    docs = [np.arange(30, dtype=np.uint16)]

    class Samples:  # only what a BatchPlan reads before it checks the sizes
        masks = None
        seq_length = 4

    with pytest.raises(ValueError, match="do not cut"):
        BatchPlan(Samples(), [0, 1, 2], [2, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="labels_format"):
        BatchPlan(Samples(), [0], [1], labels_format="left")  # type: ignore[arg-type]
    del docs


def test_collate_takes_only_what_getitems_gives(tmp_path):
    write_megatron_pair(tmp_path / "pair", [np.arange(50, dtype=np.uint16)], np.uint16)
    ds = MemmapTokenDataset(tmp_path / "pair", seq_len=7, seed=1)
    with pytest.raises(TypeError, match="__getitems__"):
        ds.collate([ds[0], ds[1]])
    with pytest.raises(TypeError, match="__getitems__"):
        ds.collate(ds.plan([0, 1, 2], [2, 1]))
    assert ds.collate(ds.__getitems__([0, 2]))["input_ids"].shape == (2, 7)
