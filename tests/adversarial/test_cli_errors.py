"""Class 12: a user's mistake is one line naming what is wrong, never a traceback; exit status 2
for an option that cannot work, 1 for bad data or files; --traceback shows the trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardtok.errors import CorruptShardError, ShardtokError, UsageError
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardStreamDataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-errors")
    write_synthetic_dataset(path, num_tokens=20_000, vocab_size=1000, mean_length=50)
    return path


def shardtok(*args: str, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardtok", *map(str, args)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


def one_line(done: subprocess.CompletedProcess, status: int, *words: str) -> None:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


STREAM = ("--seq-len", "15", "--batch-size", "2")


@pytest.mark.parametrize(
    "args, words",
    [
        (("--seq-len", "0", "--batch-size", "2"), ("--seq-len", "at least 1")),
        (("--seq-len", "15", "--batch-size", "0"), ("--batch-size", "at least 1")),
        ((*STREAM, "--rank", "2", "--world-size", "2"), ("--rank 2", "--world-size 2")),
        ((*STREAM, "--max-batches", "-1"), ("--max-batches", "at least 1")),
        ((*STREAM, "--num-workers", "-1"), ("--num-workers", "at least 0")),
        ((*STREAM, "--stride", "99"), ("stride", "seq_len + 1 = 16")),
        (("--batch-size", "2"), ("--seq-len is required",)),
    ],
)
def test_stream_usage_errors_exit_2(data, args, words):
    one_line(shardtok("stream", data, *args), 2, "shardtok stream: error:", *words)


@pytest.mark.parametrize("weight", ["nan", "inf", "-1", "0"])
def test_mix_weights_must_be_finite_and_positive(data, weight):
    done = shardtok("stream", "--source", f"{data}:{weight}", *STREAM, "--max-batches", "1")
    one_line(done, 2, "weights must be > 0 and finite")


def test_missing_paths_are_one_line_naming_them(tmp_path, data):
    missing = tmp_path / "nope"
    one_line(shardtok("inspect", missing), 1, "shardtok inspect: error:", "nope")
    one_line(shardtok("verify", missing), 1, "no such file or folder")
    one_line(shardtok("stream", missing, *STREAM), 1, "no dataset manifest")
    one_line(shardtok("export-megatron", missing, tmp_path / "out"), 1, "no dataset manifest")


def test_a_listed_shard_missing_is_one_line(tmp_path, data):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    first = sorted(copy.glob("*.tar"))[0]
    first.unlink()
    for command in (("inspect", copy), ("export-megatron", copy, tmp_path / "out")):
        one_line(shardtok(*command), 1, first.name)


def test_traceback_flag_shows_the_trace(data):
    done = shardtok("stream", data, "--seq-len", "15", "--batch-size", "2", "--stride", "99",
                    "--traceback")  # fmt: skip
    assert done.returncode == 1 and "Traceback" in done.stderr and "UsageError" in done.stderr


def test_a_closed_pipe_is_quiet(data):
    """`shardtok ... | head`: the reader went away; nothing is wrong and nothing is printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "shardtok", "stream", str(data), *STREAM, "--decode", "400",
         "--max-batches", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    process.stdout.readline()
    process.stdout.close()  # what head does after its lines
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141 and b"Traceback" not in err and err.strip() == b"", err


def test_the_dataset_constructor_fails_fast(tmp_path):
    with pytest.raises(CorruptShardError, match="no dataset manifest"):
        ShardStreamDataset(tmp_path / "missing", seq_len=15, batch_size=2)
    with pytest.raises(UsageError, match="batch_size must be at least 1"):
        ShardStreamDataset(tmp_path, seq_len=15, batch_size=0)
    with pytest.raises(ShardtokError, match="packing must be one of"):
        ShardStreamDataset(tmp_path, seq_len=15, batch_size=2, packing="best")
