"""Streaming a dataset from an HTTP server gives the same batches as from local disk."""

from __future__ import annotations

import shutil

import numpy as np

from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset
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
