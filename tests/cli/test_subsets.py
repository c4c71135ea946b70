"""The command line names some shards of a dataset as WebDataset users do: a quoted brace
pattern, a quoted glob, or several files (a shell's glob). stream, trace, inspect and verify read
just those shards, checked against the dataset's index.json."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from shardtok.cli.main import main as command
from shardtok.cli.main import run as main
from shardtok.dataset.shard_names import MIX_HINT
from shardtok.dataset.source import DatasetSource
from shardtok.format.inspect import format_summary
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset

SHAPE = ["--seq-len", "31", "--batch-size", "2"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-subsets") / "ds"
    manifest = write_synthetic_dataset(
        path, num_tokens=24_000, vocab_size=5000, mean_length=90, shard_size=4000, frame_size=2000
    )
    assert len(manifest.shards) >= 4
    return path, manifest


def test_stream_a_quoted_pattern_or_several_files(dataset, tmp_path, capsys):
    path, _ = dataset
    dumps = []
    for given in (
        [f"{path}/shard-{{000001..000002}}.tar"],  # as a shell passes a quoted pattern
        [f"{path}/shard-000002.tar", f"{path}/shard-000001.tar"],  # ... an unquoted glob
        [f"{path}/shard-00000[12].tar"],  # a quoted glob
    ):
        out = tmp_path / f"b{len(dumps)}.npz"
        args = ["stream", *given, *SHAPE, "--max-batches", "4", "--dump", str(out), "--json"]
        assert main(args) == 0
        stats = json.loads(capsys.readouterr().out)
        dumps.append(np.load(out))
    subset = DatasetSource(path, shards=["shard-000001.tar", "shard-000002.tar"])
    options = StreamOptions(seq_len=31, batch_size=2)
    want = take(SliceStream(subset, options), 4)
    assert stats["batches_per_epoch"] == len(SliceStream(subset, options))
    for dump in dumps:
        assert np.array_equal(dump["input_ids"], np.stack([b["input_ids"] for b in want]))


def test_inspect_and_verify_read_the_subset_only(dataset, tmp_path, capsys):
    path, manifest = dataset
    pattern = f"{path}/shard-{{000000,000003}}.tar"
    assert main(["inspect", pattern, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    chosen = [manifest.shards[0], manifest.shards[3]]
    assert summary["num_shards"] == 2 and summary["subset_of"] == len(manifest.shards)
    assert summary["shards"] == ["shard-000000.tar", "shard-000003.tar"]
    assert summary["num_tokens"] == sum(e.num_tokens for e in chosen)
    assert main(["inspect", pattern]) == 0
    assert f"2 of its {len(manifest.shards)} shards" in capsys.readouterr().out
    # convert's record in index.json counts the whole dataset: said so, not shown as the subset's
    text = format_summary(summary | {"extra": {"documents_written": 10_997}})
    whole, written = text.splitlines()[-2:]
    assert "whole dataset" in whole and written.split() == ["documents_written", "10997"]
    # A damaged shard outside the subset is not read; inside it, it is found.
    copy = tmp_path / "ds"
    shutil.copytree(path, copy)
    shard = copy / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[-2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(copy / "shard-000000.tar"), str(copy / "shard-000003.tar")]) == 0
    out = capsys.readouterr().out
    assert f"2 of 2 shards ok (a subset: 2 of the {len(manifest.shards)} shards" in out
    assert main(["verify", f"{copy}/shard-00000[01].tar", "--quiet"]) == 1
    assert "BAD  " in capsys.readouterr().out


def test_trace_and_resume_name_the_subset(dataset, tmp_path, capsys):
    path, _ = dataset
    pattern = f"{path}/shard-{{000000..000002}}.tar"
    assert main(["trace", pattern, *SHAPE, "--step", "3", "--num-workers", "0", "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    shards = {g["shard"] for s in trace["sequences"] for g in s["segments"]}
    assert shards <= {"shard-000000.tar", "shard-000001.tar", "shard-000002.tar"}
    state = tmp_path / "state.json"
    assert main(["stream", pattern, *SHAPE, "--max-batches", "2", "--state-out", str(state)]) == 0
    other = f"{path}/shard-{{000000..000001}}.tar"
    assert command(["stream", other, *SHAPE, "--max-batches", "2", "--state-in", str(state)]) == 1
    err = capsys.readouterr().err.strip()
    assert "shards [shard-000000.tar..shard-000002.tar] saved" in err and "\n" not in err


def test_refusals_are_one_line(dataset, tmp_path, capsys):
    path, _ = dataset
    other = tmp_path / "other"
    shutil.copytree(path, other)
    cases = {
        (f"{path}/shard-000000.tar", f"{other}/shard-000001.tar"): MIX_HINT,
        (f"{path}/shard-{{000000..000099}}.tar",): "index.json lists",
        ("https://127.0.0.1:9/ds/shard-*.tar",): "globs are for local paths only",
        (f"{path}/none-*.tar",): "matches no file",
        (f"{path}/index.json",): "name the dataset by its folder",
    }
    for name in ("stream", "inspect", "verify"):
        for given, message in cases.items():
            assert command([name, *given, *(SHAPE if name == "stream" else [])]) == 2
            err = capsys.readouterr().err.strip()
            assert message in err and "\n" not in err and "Traceback" not in err
