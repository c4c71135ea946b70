"""Streaming a dataset from an HTTP server gives the same batches as from local disk."""

from __future__ import annotations

import re
import shutil

import numpy as np

from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.helpers.fault_proxy import fault_proxy  # noqa: F401
from tests.helpers.servers import http_server  # noqa: F401  (a real nginx on loopback)


def test_http_dataset_streams_like_local(tmp_path, http_server):  # noqa: F811
    local = tmp_path / "ds"
    write_synthetic_dataset(
        local, num_tokens=20_000, mean_length=80, shard_size=5000, frame_size=2000
    )
    shutil.copytree(local, http_server.root / "ds")
    options = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=20, packing="greedy")
    for worker in range(2):
        want = take(SliceStream(local, options, worker=worker, num_workers=2), None)
        got = take(SliceStream(http_server.url("ds"), options, worker=worker, num_workers=2), None)
        assert len(got) == len(want) > 0
        for a, b in zip(got, want):
            assert all(np.array_equal(a[k], b[k]) for k in b if k != "max_seqlen")


def test_masks_stream_from_http_and_a_local_cache_like_from_disk(tmp_path, http_server):  # noqa: F811
    # Mask frames are read by range beside the streamed token frames: over HTTP and through
    # the shard cache too.
    from shardtok.dataset.source import DatasetSource
    from tests.helpers.masked import Known

    known = Known([int(n) for n in np.random.default_rng(4).integers(1, 80, size=150)])
    local = known.write(tmp_path / "sft")
    shutil.copytree(local, http_server.root / "sft")
    options = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=20, packing="bfd")
    url = http_server.url("sft")
    cached = DatasetSource(url, cache_dir=tmp_path / "cache", cache_bytes=1 << 30)
    for worker in range(2):
        want = take(SliceStream(local, options, worker=worker, num_workers=2), None)
        for source in (url, cached):
            got = take(SliceStream(source, options, worker=worker, num_workers=2), None)
            assert len(got) == len(want) > 0
            for a, b in zip(got, want):
                assert all(np.array_equal(a[k], b[k]) for k in b)
        assert any(b["num_trained_tokens"] < b["labels"].size for b in want)


def test_compact_dataset_reads_256_bytes_of_index_json(tmp_path, http_server, fault_proxy):  # noqa: F811
    # docs/FORMAT.md 6.1: index.compact is trusted beside an index.json of the size its header
    # records that records its header's digest on its first line: one GET of 256 bytes, in
    # place of a HEAD. A stream's head GET (up to 1 MiB) would cost every worker of every rank
    # as much again as the compact manifest it reads instead.
    from shardtok.dataset.source import DatasetSource

    local = tmp_path / "ds"
    write_synthetic_dataset(
        local, num_tokens=20_000, mean_length=80, shard_size=5000, frame_size=2000
    )
    shutil.copytree(local, http_server.root / "ds-compact")
    proxy = fault_proxy(http_server.port)  # no faults: it logs the requests
    source = DatasetSource(f"{proxy.endpoint}/ds-compact")
    assert len(source.manifest.shards) == len(DatasetSource(local).manifest.shards) > 1
    index = [head for _, _, head in proxy.request_log() if b" /ds-compact/index.json " in head]
    assert len(index) == 1 and index[0].startswith(b"GET "), index
    assert re.search(rb"(?i)\r\nrange: bytes=0-255\r\n", index[0]), index[0]


def test_an_earlier_release_s_dataset_streams_where_a_missing_object_answers_403(tmp_path):
    # S3 answers 403, not 404, for a missing key when the reader lacks s3:ListBucket (so do
    # CDNs in front of it): index.compact is then "denied", not "missing", and a dataset of
    # an earlier release, which has none, must still be read from its index.json.
    from shardtok.dataset.source import DatasetSource
    from tests.helpers.servers import Nginx

    local = tmp_path / "ds"
    write_synthetic_dataset(
        local, num_tokens=20_000, mean_length=80, shard_size=5000, frame_size=2000
    )
    server = Nginx(tmp_path / "nginx", server_extra="\n location /s3/ { try_files $uri =403; }")
    server.start()
    try:
        shutil.copytree(local, server.root / "s3" / "ds")
        (server.root / "s3" / "ds" / "index.compact").unlink()  # as an earlier release wrote it
        options = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=20, packing="concat")
        source = DatasetSource(server.url("s3/ds"))
        assert list(source.manifest.shards) == list(DatasetSource(local).manifest.shards)
        want = take(SliceStream(local, options), None)
        got = take(SliceStream(source, options), None)
        assert len(got) == len(want) > 0
        for a, b in zip(got, want):
            assert all(np.array_equal(a[k], b[k]) for k in b)
    finally:
        server.stop()


def test_a_remote_index_compact_is_opened_with_the_tables_first_read(
    tmp_path,
    http_server,  # noqa: F811
    fault_proxy,  # noqa: F811
):
    # A remote object's first GET also reads its head; for index.compact that head is what the
    # table reads first (FIRST_READ), not a stream's first MiB: at 10^6 shards a worker's
    # manifest is ~0.53 MB, and a 1 MiB first GET would double it.
    from shardtok.dataset.source import DatasetSource
    from shardtok.format.compact_manifest import FIRST_READ

    local = tmp_path / "ds"
    write_synthetic_dataset(
        local, num_tokens=20_000, mean_length=80, shard_size=5000, frame_size=2000
    )
    shutil.copytree(local, http_server.root / "ds-head")
    proxy = fault_proxy(http_server.port)
    source = DatasetSource(f"{proxy.endpoint}/ds-head")
    assert source.manifest.num_tokens == DatasetSource(local).manifest.num_tokens
    heads = [head for _, _, head in proxy.request_log() if b"/ds-head/index.compact" in head]
    ranges = [
        line.split(b"=", 1)[1]
        for head in heads
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"range:")
    ]
    assert ranges and ranges[0] == b"0-%d" % (FIRST_READ - 1), ranges
