"""`wds.WebDataset(urls).compose(shardtok.webdataset.documents())`: the documents the native
reader serves, for every way WebDataset opens shards, and errors instead of wrong tokens."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import webdataset as wds

import shardtok.webdataset as sw
from shardtok.errors import CorruptShardError, UsageError
from shardtok.format import ShardReader
from shardtok.webdataset.manifests import Manifests, shard_folder, shard_name
from tests.webdataset.conftest import native_documents, shard_paths


def grouped(urls, **options) -> wds.WebDataset:
    return wds.WebDataset(urls, shardshuffle=False, **options)


def assert_same(samples: list[dict], expected) -> None:
    assert [s["__key__"] for s in samples] == [d.key for d in expected]
    for sample, doc in zip(samples, expected):
        assert set(sample) == {"__key__", "__url__", "tokens"} | (
            {"mask"} if doc.mask is not None else set()
        )
        assert sample["tokens"].dtype == doc.tokens.dtype
        assert np.array_equal(sample["tokens"], doc.tokens)
        if doc.mask is not None:
            assert sample["mask"].dtype == np.uint8 and np.array_equal(sample["mask"], doc.mask)


def brace(prefix: str, count: int) -> str:
    return f"{prefix}/shard-{{000000..{count - 1:06d}}}.tar"


@pytest.mark.parametrize("name", ["text_dataset", "int32_dataset", "sft_dataset"])
def test_a_list_of_paths_gives_the_native_documents(request, name):
    folder = request.getfixturevalue(name)
    urls = shard_paths(folder)
    samples = list(grouped(urls).compose(sw.documents()))
    assert_same(samples, native_documents(folder))
    by_shard = {u.rsplit("/", 1)[1].removesuffix(".tar"): u for u in urls}
    assert all(s["__url__"] == by_shard[s["__key__"].split("/")[0]] for s in samples)
    assert all(s["tokens"].flags.writeable and s["tokens"].base is None for s in samples)


def test_brace_patterns_of_paths_and_file_urls(text_dataset):
    count = len(shard_paths(text_dataset))
    expected = native_documents(text_dataset)
    for prefix in (str(text_dataset), text_dataset.as_uri()):
        assert_same(list(grouped(brace(prefix, count)).compose(sw.documents())), expected)


def test_http_urls(text_dataset, http_server):
    shutil.copytree(text_dataset, http_server.root / "wds-text", dirs_exist_ok=True)
    url = brace(http_server.url("wds-text"), len(shard_paths(text_dataset)))
    samples = list(grouped(url).compose(sw.documents()))
    assert_same(samples, native_documents(text_dataset))
    assert samples[0]["__url__"] == http_server.url("wds-text/shard-000000.tar")
    # A URL with a query string (pre-signed) has nothing beside it: the dataset is named.
    signed = http_server.url("wds-text/shard-000001.tar?X-Signature=abc")
    with pytest.raises(UsageError, match=r"shard-000001\.tar\?X-Signature=\*\*\*: names no folder"):
        list(grouped([signed]).compose(sw.documents()))
    named = list(grouped([signed]).compose(sw.documents(dataset=http_server.url("wds-text"))))
    assert_same(
        named, [d for d in native_documents(text_dataset) if d.key.startswith("shard-000001/")]
    )


def test_where_a_shard_url_says_its_dataset_is():
    for url, folder in [
        ("data/ds/shard-000001.tar", "data/ds"),
        ("shard-000001.tar", "."),
        ("file:///d/ds/shard-000001.tar", "/d/ds"),
        ("https://h:8080/ds/shard-000001.tar", "https://h:8080/ds"),
        ("https://h/ds/shard-000001.tar?sig=1", None),
    ]:
        assert (shard_folder(url), shard_name(url)) == (folder, "shard-000001.tar")
    assert shard_folder("pipe:cat ds/shard-000001.tar") is shard_name("pipe:curl -s x.tar") is None


def test_storage_options_never_follow_a_url_list_to_a_second_origin():
    # A URL list may be someone else's: a flat Authorization header serves one origin only.
    secret = {"headers": {"Authorization": "Bearer s"}}
    manifests = Manifests(None, secret)
    assert manifests.beside("https://a.example/ds").storage_options == secret
    with pytest.raises(UsageError, match=r"sent to 2 origins .*https://b\.example/ds"):
        manifests.beside("https://b.example/ds")
    keyed = Manifests(None, {"https://a.example": secret})
    assert keyed.beside("https://a.example/ds").storage_options == secret
    assert keyed.beside("https://b.example/ds").storage_options == {}


def test_pipe_urls_need_the_dataset_named(sft_dataset):
    urls = [f"pipe:cat {p}" for p in shard_paths(sft_dataset)]
    samples = list(grouped(urls).compose(sw.documents(dataset=sft_dataset)))
    assert_same(samples, native_documents(sft_dataset))
    # No folder to find index.json in: the caller's mistake, raised whatever the handler.
    unnamed = grouped(urls).compose(sw.documents(handler=wds.ignore_and_continue))
    with pytest.raises(UsageError, match=r"pipe:cat .*names no folder.*dataset="):
        next(iter(unnamed))


def test_shuffle_serves_each_document_once(text_dataset):
    urls = shard_paths(text_dataset)
    samples = list(
        wds.WebDataset(urls, shardshuffle=len(urls), seed=3)
        .compose(sw.documents())
        .shuffle(40, seed=5)
    )
    expected = native_documents(text_dataset)
    assert [s["__key__"] for s in samples] != [d.key for d in expected]
    assert_same(sorted(samples, key=lambda s: s["__key__"]), expected)


def test_batched_without_collation_gives_lists_of_samples(sft_dataset):
    # Documents are ragged: WebDataset's default collation would try to stack them.
    batches = list(
        grouped(shard_paths(sft_dataset)).compose(sw.documents()).batched(7, collation_fn=None)
    )
    assert all(isinstance(b, list) and len(b) == 7 for b in batches[:-1])
    assert 1 <= len(batches[-1]) <= 7
    assert_same([s for b in batches for s in b], native_documents(sft_dataset))


def damaged_copy(folder, tmp_path, shard: int, frame: int):
    """A copy of the dataset with one byte flipped inside a frame of one shard's bin member."""
    copy = tmp_path / "damaged"
    shutil.copytree(folder, copy)
    path = copy / f"shard-{shard:06d}.tar"
    reader = ShardReader(path)
    f = reader.meta.frames[frame]
    offset = reader.head.bin_header.data_offset + f.compressed_offset + f.compressed_size // 2
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    return copy, path, f.first_document


def test_a_damaged_frame_raises_after_only_good_documents(text_dataset, tmp_path):
    copy, path, first_bad = damaged_copy(text_dataset, tmp_path, shard=1, frame=2)
    expected = native_documents(text_dataset)
    good = [d for d in expected if d.key < f"shard-000001/{first_bad:06d}"]
    served = []
    with pytest.raises(CorruptShardError) as caught:
        for sample in grouped(shard_paths(copy)).compose(sw.documents()):
            served.append(sample)
    message = str(caught.value)
    assert str(path) in message and "shard-000001.bin.zst" in message and "frame 2" in message
    assert_same(served, good)


def test_a_handler_that_continues_skips_the_rest_of_the_damaged_shard(text_dataset, tmp_path):
    copy, _, first_bad = damaged_copy(text_dataset, tmp_path, shard=1, frame=2)
    samples = list(
        grouped(shard_paths(copy)).compose(sw.documents(handler=wds.ignore_and_continue))
    )
    lost = [
        f"shard-000001/{n:06d}"
        for n in range(first_bad, len(ShardReader(copy / "shard-000001.tar")))
    ]
    kept = [d for d in native_documents(text_dataset) if d.key not in lost]
    assert lost and len(kept) < len(native_documents(text_dataset))
    assert_same(samples, kept)


def test_a_shard_in_another_place_is_refused(text_dataset, tmp_path):
    copy = tmp_path / "swapped"
    shutil.copytree(text_dataset, copy)
    shutil.copyfile(copy / "shard-000001.tar", copy / "shard-000002.tar")
    with pytest.raises(
        CorruptShardError, match="not the shard index.json lists as shard-000002.tar"
    ):
        list(grouped(shard_paths(copy)).compose(sw.documents()))


def test_samples_that_are_not_raw_shard_members_are_refused(text_dataset, tmp_path):
    decoded = grouped(shard_paths(text_dataset)).map(lambda s: {**s, "json": json.loads(s["json"])})
    with pytest.raises(CorruptShardError, match=r"holds a dict.*right after WebDataset's grouping"):
        next(iter(decoded.compose(sw.documents())))
    # A WebDataset tar of other samples is no shard: its first member is not the metadata.
    with wds.TarWriter(str(tmp_path / "other.tar")) as out:
        out.write({"__key__": "a", "txt": "hello"})
    with pytest.raises(CorruptShardError, match=r"a\.txt.*expected a \.json member"):
        list(grouped([str(tmp_path / "other.tar")]).compose(sw.documents(dataset=text_dataset)))
