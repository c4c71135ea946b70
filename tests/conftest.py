"""Shared fixtures. Test modules own their specialised fixtures; only cross-cutting ones live here."""

from __future__ import annotations

import os

import pytest

# Tests must never reach a model hub; the machines have none anyway.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# convert's tiktoken gate caches its verdicts; keep them out of the user's ~/.cache.
if "SHARDTOK_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["SHARDTOK_CACHE_DIR"] = tempfile.mkdtemp(prefix="shardtok-test-cache-")

# Real servers on loopback (SeaweedFS for S3, nginx for HTTP) and the fault-injecting proxy.
from tests.helpers.fault_proxy import fault_proxy  # noqa: E402,F401
from tests.helpers.servers import http_server, private_s3_server, s3_server  # noqa: E402,F401


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
