"""A subset of a dataset's shards (a list, a brace pattern, a glob) streams as a dataset of just
those shards: every planned token is the subset's and is read once per epoch, lengths, traces and
resume fingerprints are the subset's, and a list is never a mix. Also from S3 and HTTP."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from shardtok.dataset.shard_names import MIX_HINT
from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError, UsageError
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.stream import StreamOptions, StreamSetup, mix_spec
from shardtok.stream.build import document_stream
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.nodes.base import take
from shardtok.stream.provenance import trace_step
from shardtok.stream.resume.fingerprint import (
    check_fingerprint,
    source_fingerprint,
    stream_fingerprint,
)
from shardtok.stream.resume.saved import Placement
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.helpers.provenance import assert_reproduces

OPTIONS = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=0, seed=4)
SHUFFLED = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=16, seed=4, packing="greedy")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Six shards whose token ids are their global positions + 1 (a token names its place)."""
    folder = tmp_path_factory.mktemp("subsets") / "ds"
    lengths = np.random.default_rng(5).integers(1, 90, size=240).tolist()
    manifest = write_synthetic_dataset(
        folder, lengths=lengths, vocab_size=1 << 20, unique_tokens=True, first_token=1,
        shard_size=4000, frame_size=600,
    )  # fmt: skip
    assert len(manifest.shards) == 6
    starts = np.cumsum([1] + [e.num_tokens for e in manifest.shards])
    ids = {e.file: np.arange(starts[i], starts[i + 1]) for i, e in enumerate(manifest.shards)}
    return folder, ids


def pattern(folder) -> str:
    """Shards 1, 2 and 4 of 6: a range, and a second pattern after WebDataset's "::"."""
    return f"{folder}/shard-{{000001..000002}}.tar::{folder}/shard-000004.tar"


def subset_ids(ids: dict, names) -> np.ndarray:
    return np.concatenate([ids[n] for n in names])


def test_an_epoch_reads_every_token_of_the_subset_once(data):
    folder, ids = data
    source = DatasetSource.of(pattern(folder))
    names = ("shard-000001.tar", "shard-000002.tar", "shard-000004.tar")
    assert source.location == str(folder) and source.shards == names
    want = subset_ids(ids, names)
    setup = StreamSetup.single(source, OPTIONS)
    plan = setup.plan(epoch=0, world_size=2, num_workers=2)
    assert plan.total_tokens == len(want) == source.manifest.num_tokens
    # the summary's shard order names the subset's files: its positions 0-2 are not shards 0-2
    order = plan.summary().splitlines()[0].split("shard order [")[1].rstrip("]").split(", ")
    assert sorted(order) == list(names)
    read = [d for s in plan.slices for d in take(document_stream(source, s, OPTIONS, 0))]
    assert np.array_equal(np.sort(np.concatenate(read)), want)  # each token once, no other
    # The batches hold subset tokens only, as many batches as the subset's plan says.
    batches = take(SliceStream(source, OPTIONS, rank=1, world_size=2, worker=1, num_workers=2))
    assert len(batches) == plan.batches_per_slice > 0
    tokens = np.concatenate([b["input_ids"].ravel() for b in batches])
    assert np.isin(tokens, want).all()
    # The subset's view keeps index.json's order, whatever order the names came in.
    backwards = DatasetSource(folder, shards=names[::-1])
    assert [e.file for e in backwards.manifest.shards] == list(names)
    assert StreamSetup.single(backwards, OPTIONS).fingerprint == setup.fingerprint
    assert backwards.subset_positions == (1, 2, 4)


def test_the_torch_dataset_takes_a_list_as_one_dataset_never_a_mix(data, tmp_path):
    torch_dataset = pytest.importorskip("shardtok.torch")
    folder, ids = data
    names = ["shard-000000.tar", "shard-000005.tar"]
    ds = torch_dataset.ShardStreamDataset([folder / n for n in names], options=OPTIONS)
    assert ds.mix is None and ds.source.shards == tuple(names)
    batches = list(ds)
    assert len(batches) == len(ds) == ds.plan().batches_per_rank > 0
    tokens = np.concatenate([b["input_ids"].numpy().ravel() for b in batches])
    assert np.isin(tokens, subset_ids(ids, names)).all()
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    with pytest.raises(UsageError, match=MIX_HINT):  # shards of two datasets
        torch_dataset.ShardStreamDataset([folder / names[0], other / names[0]], options=OPTIONS)
    with pytest.raises(UsageError, match=MIX_HINT):  # what used to mix two datasets
        torch_dataset.ShardStreamDataset([folder, other], options=OPTIONS)
    # A mapping mixes; its keys may be subsets (two subsets of one dataset: two sources).
    mixed = torch_dataset.ShardStreamDataset(
        {pattern(folder): 0.5, str(folder / "shard-00000[05].tar"): 0.5},
        options=OPTIONS, num_batches=4,
    )  # fmt: skip
    assert [s.shards for s in mixed.sources] == [
        ("shard-000001.tar", "shard-000002.tar", "shard-000004.tar"),
        tuple(names),
    ]
    assert len(list(mixed)) == 4


def test_a_trace_names_shards_and_documents_of_the_whole_dataset(data):
    folder, ids = data
    source = DatasetSource.of(pattern(folder))
    setup = StreamSetup.single(source, SHUFFLED)
    batches = take(setup.stream(Placement(0, 1, 0, 1), epoch=0), 6)
    whole = DatasetSource(folder)
    files = [e.file for e in whole.manifest.shards]
    documents = [d for f in files for d in whole.open_random(f).documents()]
    trace = trace_step(setup, step=6, rank=0, world_size=1, num_workers=0)
    segments = [g for s in trace["sequences"] for g in s["segments"]]
    assert {g["shard"] for g in segments} <= set(source.shards)
    assert all(files[g["shard_index"]] == g["shard"] for g in segments)
    # dataset_document: the document's index in the whole dataset (export-megatron's order)
    assert_reproduces(trace, batches[5], lambda g: documents[g["dataset_document"]])


def test_fingerprints_name_the_subset_and_stay_as_they_were_without_one(data):
    folder, _ = data
    whole = DatasetSource(folder)
    index = (folder / MANIFEST_NAME).read_bytes()
    assert source_fingerprint(whole) == {  # the previous release's, key for key
        "location": str(folder),
        "manifest_sha256": hashlib.sha256(index).hexdigest(),
        "tokenizer": None,
        "num_tokens": whole.manifest.num_tokens,
    }
    subset = DatasetSource.of(pattern(folder))
    saved = source_fingerprint(subset)
    assert saved["manifest_sha256"] == hashlib.sha256(index).hexdigest()
    assert saved["shards"] == ["shard-000001.tar..shard-000002.tar", "shard-000004.tar"]
    assert saved["num_tokens"] == subset.manifest.num_tokens < whole.manifest.num_tokens

    def fingerprint(source):
        return stream_fingerprint([source], None, OPTIONS)

    other = DatasetSource(folder, shards=["shard-000001.tar", "shard-000002.tar"])
    expected = (
        r"shards \[shard-000001.tar..shard-000002.tar, shard-000004.tar\] saved, "
        r"\[shard-000001.tar..shard-000002.tar\] now"
    )
    with pytest.raises(ResumeStateError, match=expected):
        check_fingerprint(fingerprint(subset), fingerprint(other))
    with pytest.raises(ResumeStateError, match=r"shards \[every shard\] saved"):
        check_fingerprint(fingerprint(whole), fingerprint(subset))
    assert (
        check_fingerprint(fingerprint(subset), fingerprint(DatasetSource.of(pattern(folder)))) == []
    )
    assert check_fingerprint(fingerprint(whole), fingerprint(DatasetSource(folder))) == []
    # A pattern naming every shard streams what the folder does: it resumes the folder's state.
    every = DatasetSource.of(f"{folder}/shard-*.tar")
    assert len(every.shards) == 6 and source_fingerprint(every) == source_fingerprint(whole)


def test_names_index_json_does_not_list_are_refused(data):
    folder, _ = data
    missing = DatasetSource.of([folder / "shard-000001.tar", folder / "shard-000099.tar"])
    expected = f"shard-000099.tar: not a shard of the dataset: {folder}/index.json lists 6 shards"
    with pytest.raises(UsageError, match=expected):
        missing.manifest  # noqa: B018
    with pytest.raises(UsageError, match="named twice"):
        DatasetSource(folder, shards=["shard-000001.tar", "shard-000001.tar"])
    with pytest.raises(UsageError, match="not a shard file name"):
        DatasetSource(folder, shards=["index.json"])


def test_configs_keep_nanotrons_list_of_datasets(data, tmp_path):
    folder, _ = data
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    spec = mix_spec([folder, other], list_is_mix=True)
    assert [s.shards for s in spec.sources] == [None, None]
    with pytest.raises(UsageError, match="name a subset of one dataset with one pattern"):
        mix_spec([folder / "shard-000000.tar", folder / "shard-000001.tar"], list_is_mix=True)
    # A subset and its whole dataset in two stages are two sources.
    stages = [
        {"data": {"dataset": {"dataset_path": pattern(folder)}}},
        {"start_training_step": 3, "data": {"dataset": {"dataset_path": str(folder)}}},
    ]
    curriculum = load_curriculum({"data_stages": stages})
    assert [s.shards is None for s in curriculum.sources] == [False, True]


def test_a_brace_pattern_streams_from_s3_like_from_disk(data, s3_server):
    folder, _ = data
    for path in sorted(folder.iterdir()):
        s3_server.put(f"subsets/ds/{path.name}", path.read_bytes())
    url = s3_server.url("subsets/ds") + "/shard-{000003..000005}.tar"
    remote = DatasetSource.of(url, s3_server.storage_options())
    local = DatasetSource.of(f"{folder}/shard-{{000003..000005}}.tar")
    assert remote.shards == local.shards and remote.location == s3_server.url("subsets/ds")
    got, want = (take(SliceStream(s, SHUFFLED, worker=1, num_workers=2)) for s in (remote, local))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert all(np.array_equal(a[k], b[k]) for k in b)


def test_a_brace_pattern_streams_over_http_like_from_disk(data, http_server):
    folder, _ = data
    shutil.copytree(folder, http_server.root / "subsets-ds", dirs_exist_ok=True)
    url = http_server.url("subsets-ds") + "/shard-{000000,000002}.tar"
    remote = DatasetSource.of(url)
    assert remote.shards == ("shard-000000.tar", "shard-000002.tar")
    local = DatasetSource.of(f"{folder}/shard-{{000000,000002}}.tar")
    got, want = (take(SliceStream(s, SHUFFLED)) for s in (remote, local))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert all(np.array_equal(a[k], b[k]) for k in b)
