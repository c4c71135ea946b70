"""Shared fixtures. Test modules own their specialised fixtures; only cross-cutting ones live here."""

from __future__ import annotations

import multiprocessing

import pytest

# Real servers on loopback (SeaweedFS for S3, nginx for HTTP) and the fault-injecting proxy.
from tests.helpers.fault_proxy import fault_proxy  # noqa: F401
from tests.helpers.servers import http_server, private_s3_server, s3_server  # noqa: F401

PEERS_SKIP = (
    "the peers' comparison harness needs its own venv (WebDataset, Mosaic, LitData; built once "
    "into .bench/peers-venv): run with --peers, as .ci/run does after the default suite"
)


def pytest_addoption(parser):
    parser.addoption(
        "--peers", action="store_true", help="also run tests marked `peers` (they build a venv)"
    )
    parser.addoption(
        "--examples",
        action="store_true",
        help="also run the scripts in examples/ end to end (tests marked `examples`)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "peers: needs the peers' venv; runs only with --peers")
    config.addinivalue_line("markers", "examples: runs examples/ end to end; only with --examples")
    # The fork server preloads __main__: in a training job that is the script, which has imported
    # torch and shardtok.torch, so its forkserver workers start with both. Under pytest __main__
    # is pytest, and each forkserver worker would import torch itself (1-2 s a worker; ~15 s of
    # the suite). The spawn cases still start workers from a bare interpreter.
    multiprocessing.set_forkserver_preload(["torch", "shardtok.torch"])


def pytest_collection_modifyitems(config, items):
    # The examples train for real (half a minute of the default suite's six): .ci/run runs
    # them right after it, with --examples.
    if not config.getoption("--examples"):
        chosen = [item for item in items if "examples" not in item.keywords]
        if len(chosen) < len(items):
            config.hook.pytest_deselected(items=[i for i in items if "examples" in i.keywords])
            items[:] = chosen
    # Not a default: the default command must not download the peers' packages, yet the marked
    # tests must still run somewhere (.ci/run) so the harness cannot rot unnoticed.
    if config.getoption("--peers"):
        return
    skip = pytest.mark.skip(reason=PEERS_SKIP)
    for item in items:
        if "peers" in item.keywords:
            item.add_marker(skip)


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
