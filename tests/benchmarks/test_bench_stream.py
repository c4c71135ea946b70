"""benchmarks/bench_stream.py on a tiny dataset, every loader kind, so the script does not rot when
modules move. No figure is asserted. The kinds run --in-process (torch imported once, not once per
measurement); one test runs a measurement in its own process, as the real runs do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_stream.py"


def _bench(data: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--dir", str(data), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """One tiny dataset for the module: every copy the loaders read, masked ones included."""
    data = tmp_path_factory.mktemp("bench") / "stream"
    done = _bench(data, "prepare", "--tokens", "1e6", "--masked")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "zstd-masked:" in done.stdout and "% trained" in done.stdout
    return data


def test_every_throughput_kind_runs(prepared):
    sys.path.insert(0, str(REPO))
    try:
        from benchmarks.bench_stream import LABELS, kinds
    finally:
        sys.path.remove(str(REPO))
    # the spelling of the plain reference, checked here rather than measured twice
    assert kinds("lean,window") == ["lean", "plain"]
    done = _bench(prepared, "--in-process", "throughput", "--kinds", ",".join(LABELS),
                  "--workers", "0", "--batches", "20", "--repeat", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for label in LABELS.values():
        assert f"| {label} | 0 |" in done.stdout


def test_a_measurement_runs_in_a_fresh_process(prepared):
    done = _bench(prepared, "throughput", "--kinds", "lean", "--workers", "0", "--batches", "20",
                  "--repeat", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "| shardtok stream, zstd shards, `ShardLoader` | 0 |" in done.stdout


def test_an_unknown_kind_stops_before_measuring(tmp_path):
    done = _bench(tmp_path, "throughput", "--kinds", "lean,windows")
    assert done.returncode == 2 and "KeyError" not in done.stderr
    assert "unknown kind 'windows'" in done.stderr and "'plain'" in done.stderr


def test_masked_copy_and_its_comparison_run(prepared):
    done = _bench(prepared, "--in-process", "masks", "--kinds", "lean,memlean", "--packings", "concat", "greedy",
                  "--workers", "0", "--batches", "20", "--repeat", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("| shardtok ") == 3  # lean concat, lean greedy, memlean
