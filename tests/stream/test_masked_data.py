"""Masked datasets on disk: the reader, defaults, the plan's overlong count, resume, mixes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.format import ShardReader
from shardtok.stream import MixedStream, SliceStream, StreamOptions, StreamSetup, mix_spec
from shardtok.stream.batch import IGNORE_INDEX, to_hf_labels
from shardtok.stream.masked import split_flags
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.plan import epoch_plan
from shardtok.stream.resume.fingerprint import fingerprint_differences
from shardtok.testing.save_restore import check_save_restore
from tests.helpers.masked import Known, expected_shifted_labels

LENGTHS = [int(n) for n in np.random.default_rng(5).integers(1, 90, size=220)]
LENGTHS[17] = 300  # longer than a sequence


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    known = Known(LENGTHS, first=1, seed=1)
    return known, str(known.write(tmp_path_factory.mktemp("sft") / "ds", compression_level=3))


@pytest.fixture(scope="module")
def pretrain(tmp_path_factory):
    known = Known([int(n) for n in np.random.default_rng(6).integers(1, 70, size=200)], 30_000)
    return known, str(known.write(tmp_path_factory.mktemp("pt") / "ds", masked=False))


def window_of(batch) -> np.ndarray:
    """The token windows of a shifted batch: inputs plus each row's last target (or padding)."""
    last = np.where(batch["labels"][:, -1:] == IGNORE_INDEX, 0, batch["labels"][:, -1:])
    return np.concatenate([batch["input_ids"], last], axis=1)


def test_every_slice_reader_yields_the_documents_with_their_masks(sft):
    known, path = sft
    source = DatasetSource(path)
    plan = epoch_plan(source.manifest, seq_len=31, batch_size=1, world_size=3, num_workers=2)
    pairs = []
    for s in plan.slices:  # slice boundaries cut documents: both halves keep their masks
        pairs += [split_flags(d) for d in SliceReader(source, s.pieces, 2, masked=True)]
    tokens = np.concatenate([t for t, _ in pairs])
    assert np.array_equal(np.concatenate([m for _, m in pairs]), known.mask[tokens])
    assert np.array_equal(np.sort(tokens), np.arange(known.first, known.end))
    shard = source.manifest.shards[0].file
    direct = list(ShardReader(f"{path}/{shard}").documents(with_masks=True))
    assert all(np.array_equal(m, known.mask[t]) for t, m in direct)


def test_defaults_follow_the_data(sft, pretrain):
    sft_source, pt_source = DatasetSource(sft[1]), DatasetSource(pretrain[1])
    base = StreamOptions(seq_len=31, batch_size=2)
    assert base.packing is None and base.overlong is None
    on_sft = StreamSetup.single(sft_source, base).options
    assert (on_sft.packing, on_sft.overlong) == ("greedy", "truncate")
    on_pt = StreamSetup.single(pt_source, base).options
    assert (on_pt.packing, on_pt.overlong) == ("concat", "split")
    mixed = StreamSetup.mixed(mix_spec({sft[1]: 1, pretrain[1]: 1}), base).options
    assert (mixed.packing, mixed.overlong) == ("greedy", None)  # overlong: by each source
    asked = StreamSetup.single(sft_source, StreamOptions(seq_len=31, batch_size=2,
                                                         packing="concat")).options  # fmt: skip
    assert asked.packing == "concat"
    # A state saved before these options depended on the data compares as unmasked data's.
    saved = {"sources": [], "options": {k: v for k, v in on_pt.to_dict().items()
                                        if k not in ("overlong",)}}  # fmt: skip
    assert fingerprint_differences(saved, {"sources": [], "options": on_pt.to_dict()}) == []


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_the_plan_counts_overlong_documents_exactly(sft, overlong):
    known, path = sft
    stream = SliceStream(path, StreamOptions(seq_len=63, batch_size=2, overlong=overlong))
    long = [n for n in LENGTHS if n > 64]
    assert stream.plan.overlong_documents == len(long) > 0
    lost = sum(n - 64 for n in long) if overlong == "truncate" else sum(long)
    assert stream.plan.overlong_tokens == lost
    assert f"({overlong}): {len(long)}" in stream.plan.summary()
    batches = take(stream, None)
    assert len(batches) == stream.plan.batches_per_slice
    assert stream.stats()["overlong_documents"] <= len(long)  # met by this process


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 120), min_size=3, max_size=60),
    seq_len=st.integers(4, 40),
    slices=st.sampled_from([(1, 1), (2, 1), (2, 3)]),
    packing=st.sampled_from(["greedy", "bfd"]),
    overlong=st.sampled_from(["truncate", "drop"]),
)
def test_truncating_or_dropping_never_runs_short_of_the_planned_batches(
    tmp_path_factory, lengths, seq_len, slices, packing, overlong
):
    path = Known(lengths).write(tmp_path_factory.mktemp("o") / "ds", shard_size=300)
    options = StreamOptions(seq_len=seq_len, batch_size=1, packing=packing, overlong=overlong,
                            shuffle_buffer=5, bfd_window=4)  # fmt: skip
    world, workers = slices
    for rank in range(world):
        for worker in range(workers):
            try:
                stream = SliceStream(path, options, rank=rank, world_size=world, worker=worker,
                                     num_workers=workers)  # fmt: skip
            except Exception as exc:  # too little data left for every slice: said up front
                assert "cannot give every one" in str(exc)
                return
            assert len(take(stream, None)) == stream.plan.batches_per_slice


@pytest.mark.parametrize("packing", ["bfd", "greedy", "concat"])
@pytest.mark.parametrize("overlong", ["split", "truncate"])
def test_masked_streams_resume_exactly(sft, packing, overlong):
    _, path = sft
    options = StreamOptions(seq_len=31, batch_size=2, packing=packing, overlong=overlong,
                            shuffle_buffer=16, bfd_window=24)  # fmt: skip
    check_save_restore(
        lambda: SliceStream(path, options, worker=1, num_workers=2),
        midpoints=(0, 1, 3, 8, 13, -2, -1),
    )


def test_a_mix_of_masked_and_unmasked_data(sft, pretrain):
    spec = mix_spec({sft[1]: 1.0, pretrain[1]: 1.0})
    options = StreamOptions(seq_len=47, batch_size=3)
    hf = MixedStream(spec, replace(options, labels_format="hf"), num_batches=30)
    seen = set()
    for batch, hf_batch in zip(MixedStream(spec, options, num_batches=30), hf, strict=True):
        window = window_of(batch)
        want = expected_shifted_labels([sft[0], pretrain[0]], [True, False], window, False)
        assert np.array_equal(batch["labels"], want)
        assert np.array_equal(hf_batch["labels"], to_hf_labels(want.copy()))
        assert batch["num_trained_tokens"] == int((want != IGNORE_INDEX).sum())
        seen |= {bool(sft[0].mine(window[r, :1])[0]) for r in range(len(window))}
    assert seen == {True, False}  # both kinds of rows were checked


def test_a_mixed_masked_stream_saves_and_restores(sft, pretrain):
    spec = mix_spec({sft[1]: 2.0, pretrain[1]: 1.0})
    options = StreamOptions(seq_len=31, batch_size=2, packing="bfd", bfd_window=16)
    check_save_restore(lambda: MixedStream(spec, options, num_batches=40), midpoints=(0, 3, 21))


def test_elastic_resume_of_masked_data(sft):
    torch = pytest.importorskip("torch")
    from shardtok.stream import merge_states
    from shardtok.torch import ShardStreamDataset

    known, path = sft
    options = dict(seq_len=31, batch_size=2, shuffle_buffer=8, overlong="split")

    def run(ds, count=None):
        out = []
        for batch in ds:
            out.append({k: v.numpy().copy() for k, v in batch.items() if torch.is_tensor(v)})
            if len(out) == count:
                break
        return out

    before, states = [], []
    for rank in range(2):
        ds = ShardStreamDataset(path, rank=rank, world_size=2, **options)
        before += run(ds, 4)
        states.append(ds.state_dict())
    after = []
    for rank in range(3):
        ds = ShardStreamDataset(path, rank=rank, world_size=3, **options)
        ds.load_state_dict(merge_states(states))
        after += run(ds)
    labels = np.concatenate([b["labels"].ravel() for b in before + after])
    trained = labels[labels != IGNORE_INDEX]
    assert len(np.unique(trained)) == len(trained), "a target was trained twice"
    assert (known.mask[trained] == 1).all()
    with pytest.raises(ResumeStateError, match="overlong='split'"):
        ds = ShardStreamDataset(path, rank=0, world_size=3, **{**options, "overlong": "truncate"})
        ds.load_state_dict(merge_states(states), strict=False)
        next(iter(ds))
