"""States written by shardtok 0.1 are refused in one line naming that release (the promise in
docs/RESUME.md): 0.3 was the last release to upgrade them.

tests/fixtures/v0_1/ holds what 0.1 itself wrote (see make_fixtures.py there): two datasets
imported from generated Megatron pairs (tests/fixtures/v0_3 streams them too) and the states 0.1
saved (a dataset worker, greedy packing, a weighted mix, a 2-worker ShardLoader, a merged
elastic state, the CLI's state file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardtok.cli.main import main
from shardtok.errors import ResumeStateError
from shardtok.stream.state import UNVERSIONED
from shardtok.torch import ShardLoader, ShardStreamDataset

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "v0_1"
CASES = json.loads((HERE / "states.json").read_text())
BASE = dict(seq_len=16, batch_size=2, seed=3, shuffle_buffer=32, shuffle_tokens=0)
REFUSED = re.escape(UNVERSIONED)


def dataset(options: dict) -> ShardStreamDataset:
    options = dict(options)
    path = options.pop("path", str(HERE / "dataset_a"))
    if isinstance(path, dict):  # the mix was saved with 0.1's absolute paths: same weights here
        weights = list(path.values())
        path = {str(HERE / "dataset_a"): weights[0], str(HERE / "dataset_b"): weights[1]}
    return ShardStreamDataset(path, **{**BASE, **options})


@pytest.mark.parametrize("name", ["concat", "greedy", "mix", "elastic"])
def test_dataset_states_of_0_1_are_refused_naming_the_release(name):
    case = CASES[name]
    assert "format" not in case["state"]  # really a 0.1 state, without the envelope
    with pytest.raises(ResumeStateError, match=REFUSED) as refused:
        dataset(case["options"]).load_state_dict(case["state"])
    assert str(refused.value) == UNVERSIONED


def test_a_loader_state_of_0_1_is_refused_naming_the_release():
    case = CASES["loader"]
    loader = ShardLoader(dataset(case["options"]), num_workers=2)
    with pytest.raises(ResumeStateError, match=REFUSED):
        loader.load_state_dict(case["state"])


def test_a_cli_state_file_of_0_1_is_refused_in_one_line(tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_text((HERE / "cli_state.json").read_text())
    args = ["stream", str(HERE / "dataset_a"), "--seq-len", "16", "--batch-size", "2",
            "--seed", "3", "--shuffle-buffer", "32", "--shuffle-tokens", "0", "--max-batches",
            "5", "--state-in", str(state)]  # fmt: skip
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert UNVERSIONED in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert main(["trace", str(HERE / "dataset_a"), "--seq-len", "16", "--batch-size", "2",
                 "--state", str(state), "--step", "9"]) != 0  # fmt: skip
    assert UNVERSIONED in capsys.readouterr().err


def test_a_state_from_a_newer_release_is_refused_with_both_versions():
    ds = dataset(CASES["concat"]["options"])
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    state["version"] = 3
    with pytest.raises(ResumeStateError, match="version 3 .* reads version 2"):
        ds.load_state_dict(state)
