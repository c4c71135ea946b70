"""`stream_documents()`: the raw-stream stage, one pass through the native reader per shard."""

from __future__ import annotations

import shutil

import pytest
import webdataset as wds

import shardtok.webdataset as sw
from shardtok.errors import CorruptShardError, UsageError
from tests.webdataset.conftest import native_documents, shard_paths
from tests.webdataset.test_documents import assert_same, brace, damaged_copy


def streamed(urls, **options) -> wds.DataPipeline:
    return wds.DataPipeline(
        wds.SimpleShardList(urls), wds.split_by_worker, sw.stream_documents(**options)
    )


@pytest.mark.parametrize("name", ["text_dataset", "sft_dataset"])
def test_local_shards_give_the_native_documents(request, name):
    folder = request.getfixturevalue(name)
    urls = shard_paths(folder)
    samples = list(streamed(urls))
    assert_same(samples, native_documents(folder))
    assert samples[-1]["__url__"] == urls[-1]
    # The same samples as the default stage, which reads the shards through WebDataset's tar.
    assert_same(
        list(wds.WebDataset(urls, shardshuffle=False).compose(sw.documents())),
        native_documents(folder),
    )


def test_http_brace_pattern(sft_dataset, http_server):
    shutil.copytree(sft_dataset, http_server.root / "wds-sft", dirs_exist_ok=True)
    url = brace(http_server.url("wds-sft"), len(shard_paths(sft_dataset)))
    assert_same(list(streamed(url)), native_documents(sft_dataset))


def test_damage_raises_and_pipe_urls_are_refused(text_dataset, tmp_path):
    copy, path, _ = damaged_copy(text_dataset, tmp_path, shard=2, frame=1)
    with pytest.raises(CorruptShardError, match=r"shard-000002\.bin\.zst.*frame 1"):
        list(streamed(shard_paths(copy)))
    with pytest.raises(UsageError, match=r"pipe:cat .*has no place beside it.*documents\(dataset="):
        list(streamed([f"pipe:cat {path}"], handler=wds.ignore_and_continue))
