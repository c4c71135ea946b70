"""Masked (fine-tuning) data in PyTorch: a real causal LM's loss, DataCollatorWithFlattening,
workers under every start method, mixes in DataLoader workers, and the memmap path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardtok.errors import CorruptShardError
from shardtok.format import ShardReader
from shardtok.format.megatron_io import export_megatron
from shardtok.stream import MixedStream, SliceStream, StreamOptions, mix_spec
from shardtok.stream.batch import IGNORE_INDEX
from shardtok.stream.nodes.array_documents import ArrayDocuments
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.greedy import GreedyPacker
from shardtok.torch import ShardLoader, ShardStreamDataset
from shardtok.torch.memmap_dataset import MemmapTokenDataset
from tests.helpers.batches import assert_same, copies
from tests.helpers.masked import Known, expected_shifted_labels
from tests.helpers.tiny_lm import tiny_causal_lm as tiny_lm

VOCAB = 400
LENGTHS = [int(n) for n in np.random.default_rng(8).integers(2, 60, size=160)]


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    known = Known(LENGTHS, first=1, seed=2)
    return known, str(known.write(tmp_path_factory.mktemp("sft") / "ds"))


@pytest.fixture(scope="module")
def sft_plain(tmp_path_factory):
    """The same documents uncompressed (the memmap path)."""
    known = Known(LENGTHS, first=1, seed=2)
    path = tmp_path_factory.mktemp("sftplain") / "ds"
    return known, str(known.write(path, compression_level=None))


def in_process(path, options, workers, count=None, **kw):
    """The batches a loader with `workers` workers yields, built in process (round robin)."""
    streams = [SliceStream(path, options, worker=w, num_workers=workers, **kw) for w in range(workers)]  # fmt: skip
    out = []
    for i in range(count or len(streams[0]) * workers):
        out.append({k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                    for k, v in next(streams[i % workers]).items()})  # fmt: skip
    return out


# -- the labels a model trains on ---------------------------------------------------------------


def tiny_causal_lm():
    pytest.importorskip("transformers")
    return tiny_lm(VOCAB)


def first_batch(known: Known, masked: bool, labels_format: str) -> dict:
    docs = known.masked_documents() if masked else known.documents()
    packer = GreedyPacker(ArrayDocuments(docs), 47, lookahead=3, masked=masked)
    return next(Batcher(packer, 3, mask_boundary_labels=True, labels_format=labels_format))


@pytest.mark.parametrize("masked", [False, True], ids=["pretraining", "sft"])
def test_a_causal_lm_trains_exactly_the_trained_targets(masked):
    known = Known([int(n) for n in np.random.default_rng(1).integers(3, 30, 40)], seed=4)
    hf = first_batch(known, masked, "hf")
    assert hf["input_ids"].max() < VOCAB
    model = tiny_causal_lm()
    inputs = {k: torch.from_numpy(hf[k]) for k in ("input_ids", "position_ids")}
    with torch.no_grad():
        out = model(**inputs, labels=torch.from_numpy(hf["labels"]))
    # By hand: logits[:, i] against the target of input i, where that target is trained (same
    # document and, for SFT, mask bit 1), computed from the documents, not from our labels;
    # each row's last target has no hf column.
    window = np.concatenate([hf["input_ids"], np.zeros((3, 1), np.int64)], axis=1)
    for row, seq in enumerate(take(GreedyPacker(ArrayDocuments(known.documents()), 47,
                                                lookahead=3), 3)):  # fmt: skip
        window[row] = seq.tokens
    targets = expected_shifted_labels([known], [masked], window, boundary=True)
    targets[:, -1] = IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(
        out.logits.float().reshape(-1, VOCAB), torch.from_numpy(targets).reshape(-1),
        ignore_index=IGNORE_INDEX,
    )  # fmt: skip
    torch.testing.assert_close(out.loss, expected)
    assert hf["num_trained_tokens"] == int((targets != IGNORE_INDEX).sum()) > 0
    if masked:  # the prompts really are left out
        assert hf["num_trained_tokens"] < first_batch(known, False, "hf")["num_trained_tokens"]


def test_sft_rows_equal_data_collator_with_flattening():
    transformers = pytest.importorskip("transformers")
    known = Known([int(n) for n in np.random.default_rng(2).integers(3, 20, 30)], seed=6)
    batch = first_batch(known, True, "hf")
    features, keep = [], np.zeros(batch["input_ids"].shape, dtype=bool)
    for row, (ids, docs) in enumerate(zip(batch["input_ids"], batch["document_ids"])):
        bounds = [0, *np.flatnonzero(np.diff(docs)) + 1, len(ids)]
        for a, c in zip(bounds, bounds[1:]):
            if not known.mine(ids[a : a + 1])[0]:  # padding: the collator has none
                continue
            doc = ids[a:c]
            labels = np.where(known.mask[doc] == 1, doc, IGNORE_INDEX)
            features.append({"input_ids": doc.tolist(), "labels": labels.tolist()})
            keep[row, a:c] = True
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    theirs = collator(features, return_tensors="np")
    for key in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(theirs[key], batch[key][keep][None]), key
    lengths = [len(f["input_ids"]) for f in features]
    assert theirs["cu_seq_lens_q"].tolist() == np.cumsum([0, *lengths]).tolist()


# -- PyTorch workers -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_shard_loader_workers_carry_masks_and_trained_counts(sft, method):
    _, path = sft
    options = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=16, labels_format="hf")
    ds = ShardStreamDataset(path, options=options)
    loader = ShardLoader(ds, num_workers=2, multiprocessing_context=method)
    got = copies(loader)
    assert_same(got, in_process(path, options, 2))
    for batch in got:
        assert batch["num_trained_tokens"] == int((batch["labels"] != IGNORE_INDEX).sum())


def test_shard_loader_resumes_masked_data_exactly(sft):
    _, path = sft
    options = StreamOptions(seq_len=31, batch_size=2, packing="bfd", bfd_window=12)
    loader = ShardLoader(ShardStreamDataset(path, options=options), num_workers=2)
    whole = copies(loader)
    it = iter(loader)
    head = copies([next(it) for _ in range(5)])
    state = loader.state_dict()
    del it
    fresh = ShardLoader(ShardStreamDataset(path, options=options), num_workers=2)
    fresh.load_state_dict(state)
    assert_same(head + copies(fresh), whole)


def test_a_mix_in_dataloader_workers(sft, tmp_path):
    known_pt = Known([int(n) for n in np.random.default_rng(3).integers(1, 60, 150)], 30_000)
    pretrain = str(known_pt.write(tmp_path / "pt", masked=False))
    spec = {sft[1]: 1.0, pretrain: 1.0}
    options = StreamOptions(seq_len=31, batch_size=2, mask_boundary_labels=False)
    ds = ShardStreamDataset(spec, options=options, num_batches=12)
    got = copies(DataLoader(ds, batch_size=None, num_workers=2))
    streams = [MixedStream(mix_spec(spec), ds.options, worker=w, num_workers=2, num_batches=6)
               for w in range(2)]  # fmt: skip
    want = [{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
             for k, v in next(streams[i % 2]).items()} for i in range(12)]  # fmt: skip
    assert_same(got, want)


# -- the memmap path -----------------------------------------------------------------------------


def test_memmap_path_serves_masks(sft_plain, tmp_path):
    known, path = sft_plain
    ds = MemmapTokenDataset(path, seq_len=31, num_samples=40, seed=3, shared_memory=False)
    assert ds.masked
    batch = ds.collate(ds.__getitems__(list(range(8))))
    window = np.stack([ds.samples[i] for i in range(8)])
    want = expected_shifted_labels([known], [True], window, boundary=True)
    assert np.array_equal(batch["labels"].numpy(), want)
    assert batch["num_trained_tokens"] == int((want != IGNORE_INDEX).sum())
    assert torch.equal(ds[3]["labels"], batch["labels"][3])  # one sample alike
    loader = ShardLoader(ds, batch_size=4, num_workers=2)
    direct = [ds.collate(ds.__getitems__(list(range(i, min(i + 4, len(ds))))))
              for i in range(0, len(ds), 4)]  # fmt: skip
    assert_same(copies(loader), copies(direct))
    # The Megatron pair export-megatron --mask writes is served the same way.
    export_megatron(path, tmp_path / "pair", masks=True)
    pair = MemmapTokenDataset(tmp_path / "pair", seq_len=31, num_samples=40, seed=3,
                              shared_memory=False)  # fmt: skip
    assert_same([pair.collate(pair.__getitems__(list(range(8))))], [batch])


def test_memmap_path_checks_mask_frames(sft_plain, tmp_path):
    import shutil

    _, path = sft_plain
    damaged = tmp_path / "damaged"
    shutil.copytree(path, damaged)
    shard = sorted(damaged.glob("*.tar"))[0]
    offset = ShardReader(shard)._mask.header.data_offset  # the first mask frame
    data = bytearray(shard.read_bytes())
    data[offset] ^= 1
    shard.write_bytes(bytes(data))
    ds = MemmapTokenDataset(damaged, seq_len=31, num_samples=40, seed=3, shared_memory=False)
    with pytest.raises(CorruptShardError, match=r"\.mask.*crc32"):
        for i in range(0, len(ds), 8):
            ds.collate(ds.__getitems__(list(range(i, min(i + 8, len(ds))))))
    export_megatron(path, tmp_path / "pair", masks=True)
    mask_bin = tmp_path / "pair_mask.bin"
    mask_bin.write_bytes(b"\x02" + mask_bin.read_bytes()[1:])
    pair = MemmapTokenDataset(tmp_path / "pair", seq_len=31, num_samples=40, seed=3,
                              shared_memory=False)  # fmt: skip
    with pytest.raises(ValueError, match="masks are 0 or 1"):
        for i in range(len(pair)):
            pair[i]
