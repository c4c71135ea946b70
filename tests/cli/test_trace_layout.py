"""`shardtok trace` takes the worker count from a state, or from --num-workers, never from a
default: each count deals a rank's batches out differently."""

from __future__ import annotations

import json

import pytest

from shardtok.cli.main import main
from shardtok.testing.synthetic import write_synthetic_dataset

SHAPE = ["--seq-len", "31", "--batch-size", "2", "--packing", "greedy", "--shuffle-buffer", "4"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("layout")
    write_synthetic_dataset(path, num_tokens=20_000, vocab_size=5000, mean_length=60,
                            shard_size=6000)  # fmt: skip
    return str(path)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_without_a_state_the_worker_count_is_asked_for(dataset, capsys):
    assert main(["trace", dataset, *SHAPE, "--step", "3"]) == 2
    err = one_line_error(capsys)
    assert err.startswith("shardtok trace: error: give --num-workers N")
    assert "(0 for in-process)" in err and "--state FILE" in err
    traced = {}
    for workers in ("0", "2"):
        assert main(["trace", dataset, *SHAPE, "--step", "3", "--num-workers", workers,
                     "--json"]) == 0  # fmt: skip
        traced[workers] = json.loads(capsys.readouterr().out)
    assert (traced["0"]["worker"], traced["2"]["worker"]) == (0, 0)
    assert (traced["0"]["local_batch"], traced["2"]["local_batch"]) == (2, 1)  # from 0
    assert traced["0"]["sequences"] != traced["2"]["sequences"]


def test_a_state_says_the_worker_count(dataset, tmp_path, capsys):
    state = tmp_path / "state.json"
    layout = ["--world-size", "2", "--rank", "1", "--num-workers", "2"]
    assert main(["stream", dataset, *SHAPE, *layout, "--max-batches", "2",
                 "--state-out", str(state), "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["trace", dataset, *SHAPE, "--step", "4", *layout, "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main(["trace", dataset, *SHAPE, "--step", "4", "--state", str(state), "--json"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert (traced["num_workers"], traced["rank"], traced["world_size"]) == (2, 1, 2)
    assert traced["sequences"] == expected["sequences"] and traced["state_steps"] == 2
    agreeing = ["--state", str(state), "--num-workers", "2"]
    assert main(["trace", dataset, *SHAPE, "--step", "4", *agreeing, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sequences"] == expected["sequences"]
    assert main(["trace", dataset, *SHAPE, "--step", "4", "--state", str(state),
                 "--num-workers", "1"]) == 2  # fmt: skip
    err = one_line_error(capsys)
    assert f"--num-workers 1 contradicts {state}, saved by a run with 2 worker" in err
    assert "leave --num-workers out" in err
