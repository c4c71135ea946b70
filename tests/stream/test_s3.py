"""Streaming from S3 (a real SeaweedFS on loopback) gives the local stream, token for token,
also when connections reset, stall or truncate, and when the server restarts mid-epoch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError, StorageError
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.storage import RetryPolicy
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.helpers.fault_proxy import Fault
from tests.helpers.servers import SeaweedS3

QUICK = RetryPolicy(max_attempts=12, initial_delay=0.01, max_delay=0.1, timeout=1.5)
OPTIONS = StreamOptions(seq_len=63, batch_size=4, shuffle_buffer=64, packing="concat")


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("s3ds") / "ds"
    # Several shards and frames so a stream crosses shard, frame and block boundaries.
    write_synthetic_dataset(
        folder, num_tokens=120_000, mean_length=150, shard_size=40_000, frame_size=8_000, seed=3
    )
    return folder


def upload(server: SeaweedS3, folder: Path, prefix: str) -> str:
    for path in sorted(folder.iterdir()):
        server.put(f"{prefix}/{path.name}", path.read_bytes())
    return server.url(prefix)


def batches(source, options=OPTIONS, worker=0, num_workers=2, count=None):
    return take(SliceStream(source, options, worker=worker, num_workers=num_workers), count)


def assert_same(got, want):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        for key in b:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_s3_dataset_streams_like_local(local_dataset, s3_server, packing):
    url = upload(s3_server, local_dataset, f"plain-{packing}")
    options = StreamOptions(seq_len=63, batch_size=4, shuffle_buffer=64, packing=packing)
    for worker in range(2):
        remote = DatasetSource(url, s3_server.storage_options(), retry=QUICK)
        assert_same(batches(remote, options, worker), batches(local_dataset, options, worker))


def test_faults_between_client_and_s3_lose_and_repeat_no_token(
    local_dataset, s3_server, fault_proxy
):
    url = upload(s3_server, local_dataset, "faulty")
    proxy = fault_proxy(s3_server.ports["s3"])
    # The first requests (manifest, shard heads, first blocks) meet every kind of fault.
    proxy.fail_next(
        Fault.reset(2_000),
        Fault.truncate(9_000),
        Fault.stall(500, seconds=2.5),
        Fault.drop(),
        Fault.reset(20_000),
        Fault.truncate(30_000),
        Fault.reset(100),
    )
    remote = DatasetSource(url, s3_server.storage_options(endpoint=proxy.endpoint), retry=QUICK)
    assert_same(batches(remote, worker=0), batches(local_dataset, worker=0))
    assert len(proxy.faults_applied) == 7


def test_s3_restart_mid_epoch_continues_with_nothing_lost(local_dataset, private_s3_server):
    server = private_s3_server
    url = upload(server, local_dataset, "outage")
    want = batches(local_dataset, worker=1)
    policy = RetryPolicy(max_attempts=60, initial_delay=0.05, max_delay=0.3, timeout=2)
    stream = SliceStream(
        DatasetSource(url, server.storage_options(), retry=policy), OPTIONS, worker=1, num_workers=2
    )
    got = take(stream, 3)
    server.stop(kill=True)
    result: dict = {}

    def consume_rest() -> None:
        try:
            result["rest"] = take(stream, None)
        except BaseException as exc:  # reported below
            result["error"] = exc

    consumer = threading.Thread(target=consume_rest)
    consumer.start()
    time.sleep(1.0)
    server.start()
    consumer.join(timeout=120)
    assert "error" not in result, result.get("error")
    assert_same(got + result["rest"], want)


def test_missing_shard_and_missing_dataset_fail_fast(local_dataset, s3_server, caplog):
    url = upload(s3_server, local_dataset, "gappy")
    first_shard = sorted(p.name for p in local_dataset.iterdir() if p.suffix == ".tar")[0]
    s3_server.client().delete_object(Bucket=s3_server.bucket, Key=f"gappy/{first_shard}")
    caplog.set_level("WARNING", logger="shardtok.storage")
    with pytest.raises(StorageError) as info:  # the two slices together read every shard
        for worker in range(2):
            batches(DatasetSource(url, s3_server.storage_options(), retry=QUICK), worker=worker)
    assert first_shard in str(info.value)
    with pytest.raises((StorageError, CorruptShardError)) as info:
        _ = DatasetSource(
            s3_server.url("no-such-dataset"), s3_server.storage_options(), retry=QUICK
        ).manifest
    assert MANIFEST_NAME in str(info.value)
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert retries == []  # a 404 is final: not retried
