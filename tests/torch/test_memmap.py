"""The memmap path: virtual token arrays over uncompressed shards, and the map-style Dataset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardtok.format import write_megatron_pair
from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import ConcatTokens, open_local_tokens
from shardtok.storage import open_source
from shardtok.stream.batch import build_batch
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from tests.helpers.batches import check_model_keys


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain")
    manifest = write_synthetic_dataset(
        path, num_tokens=40_000, vocab_size=100_000, mean_length=120, shard_size=9000,
        frame_size=3000, compression_level=None,
    )  # fmt: skip
    assert len(manifest.shards) > 3
    return path


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    data=st.data(),
)
def test_concat_tokens_indexes_like_one_array(lengths, data):
    arrays = [
        np.arange(sum(lengths[:i]), sum(lengths[: i + 1]), dtype=np.int32)
        for i in range(len(lengths))
    ]
    whole = np.concatenate(arrays)
    virtual = ConcatTokens(arrays)
    assert len(virtual) == len(whole) and virtual.shape == whole.shape
    n = len(whole)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(0, n))
    assert np.array_equal(virtual[a:b], whole[a:b])
    if n:
        picks = data.draw(st.lists(st.integers(0, n - 1), max_size=20))
        assert np.array_equal(virtual[np.array(picks, dtype=np.int64)], whole[picks])
        assert virtual[picks[0] if picks else 0] == whole[picks[0] if picks else 0]


def test_shards_read_as_one_token_array(plain):
    tokens, sizes = open_local_tokens(plain)
    assert isinstance(tokens, ConcatTokens) and int(sizes.sum()) == len(tokens)
    from shardtok.format import ShardReader, load_manifest

    docs = [
        d
        for e in load_manifest(plain).shards
        for d in ShardReader(open_source(plain / e.file)).documents()
    ]
    assert np.array_equal(tokens[0 : len(tokens)], np.concatenate(docs))


def test_dataset_samples_are_gpt_samples(plain):
    tokens, sizes = open_local_tokens(plain)
    reference = GPTSamples(np.asarray(tokens[0 : len(tokens)]), sizes, 31, 300, 9)
    ds = MemmapTokenDataset(plain, seq_len=31, num_samples=300, seed=9)
    assert len(ds) == len(reference)
    for i in (0, 1, 17, len(ds) - 1):
        sample = ds[i]
        want = reference[i]
        assert np.array_equal(sample["input_ids"].numpy(), want[:-1])
        assert np.array_equal(sample["labels"].numpy(), want[1:])
        lengths = reference.document_boundaries(i).lengths
        starts = [int(s) for s in (np.cumsum(lengths) - lengths)[lengths > 0] if s < 31]
        cu = sample["cu_seqlens"].numpy()
        assert list(cu[:-1]) == starts and cu[-1] == 31
        for a, c in zip(cu[:-1], cu[1:]):
            assert np.array_equal(sample["position_ids"][a:c].numpy(), np.arange(c - a))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batches_with_collate(plain, num_workers):
    ds = MemmapTokenDataset(plain, seq_len=31, num_samples=200, seed=2)
    loader = DataLoader(ds, batch_size=4, collate_fn=ds.collate, num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == -(-len(ds) // 4)
    for k, batch in enumerate(batches):
        rows = range(k * 4, min(len(ds), k * 4 + 4))
        assert batch["input_ids"].shape == (len(rows), 31)
        for r, i in enumerate(rows):
            assert np.array_equal(batch["input_ids"][r].numpy(), ds.sequence(i).tokens[:-1])
            if i % 10 == 0:
                assert np.array_equal(
                    batch["document_ids"][r].numpy(), ds[i]["document_ids"].numpy()
                )


def test_megatron_pair_and_compressed_data(tmp_path, plain):
    docs = [np.arange(n, dtype=np.uint16) for n in (5, 40, 17, 60)]
    write_megatron_pair(tmp_path / "pair", docs, np.uint16)
    tokens, sizes = open_local_tokens(tmp_path / "pair")
    assert list(sizes) == [5, 40, 17, 60] and np.array_equal(tokens, np.concatenate(docs))
    ds = MemmapTokenDataset(tmp_path / "pair.bin", seq_len=8, seed=1)
    assert len(ds) == (122 - 1) // 8
    compressed = tmp_path / "zstd"
    write_synthetic_dataset(compressed, num_tokens=2000, mean_length=50)
    with pytest.raises(ValueError, match="uncompressed"):
        open_local_tokens(compressed)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    seq_len=st.integers(2, 16),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=6),
    mask=st.booleans(),
)
def test_batched_gather_equals_sample_by_sample(tmp_path_factory, lengths, seq_len, picks, mask):
    if sum(lengths) <= seq_len + 1:
        return
    docs = [np.arange(n, dtype=np.uint16) + 7 * k for k, n in enumerate(lengths)]
    prefix = tmp_path_factory.mktemp("pair") / "pair"
    write_megatron_pair(prefix, docs, np.uint16)
    ds = MemmapTokenDataset(prefix, seq_len=seq_len, num_samples=50, seed=3,
                            mask_boundary_labels=mask, shared_memory=False)  # fmt: skip
    indices = [p % len(ds) for p in picks]
    fast = check_model_keys(ds.collate(ds.__getitems__(indices)))
    slow = build_batch([ds.sequence(i) for i in indices], mask_boundary_labels=mask)
    assert fast.keys() == slow.keys()
    for key in slow:
        want = slow[key]
        got = fast[key].numpy() if hasattr(fast[key], "numpy") else fast[key]
        assert np.array_equal(got, want), key
