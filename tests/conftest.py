"""Shared fixtures. Test modules own their specialised fixtures; only cross-cutting ones live here."""

from __future__ import annotations

import pytest

# Real servers on loopback (SeaweedFS for S3, nginx for HTTP) and the fault-injecting proxy.
from tests.helpers.fault_proxy import fault_proxy  # noqa: F401
from tests.helpers.servers import http_server, private_s3_server, s3_server  # noqa: F401


@pytest.fixture(scope="session")
def torch_stream_dataset(tmp_path_factory):
    """A 60k-token synthetic dataset (3 shards, small frames) for the PyTorch adapter's tests."""
    from shardtok.testing.synthetic import write_synthetic_dataset

    path = tmp_path_factory.mktemp("torchds")
    write_synthetic_dataset(
        path, num_tokens=60_000, vocab_size=70_000, mean_length=150, shard_size=20_000,
        frame_size=4000,
    )  # fmt: skip
    return path
