"""States written by shardtok 0.1 resume bit-exactly (the promise in docs/STREAMING.md).

tests/fixtures/v0_1/ holds what 0.1 itself wrote (see make_fixtures.py there): two datasets
imported from generated Megatron pairs, the states 0.1 saved after a few batches (a dataset
worker, greedy packing, a weighted mix, a 2-worker ShardLoader, a merged elastic state, the
CLI's state file) and the batches 0.1 yielded after restoring each of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardtok.cli.main import run as cli
from shardtok.errors import ResumeStateError
from shardtok.torch import ShardLoader, ShardStreamDataset

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "v0_1"
CASES = json.loads((HERE / "states.json").read_text())
# shuffle_tokens=0: 0.1's shuffle buffer had no token bound (a state saved then names it).
BASE = dict(seq_len=16, batch_size=2, seed=3, shuffle_buffer=32, shuffle_tokens=0)


def expected(name: str) -> list[dict]:
    data = np.load(HERE / f"{name}.npz")
    out: dict[int, dict] = {}
    for key in data.files:
        i, field = key.split("/")
        out.setdefault(int(i), {})[field] = data[key]
    return [out[i] for i in sorted(out)]


def dataset(options: dict) -> ShardStreamDataset:
    options = dict(options)
    path = options.pop("path", str(HERE / "dataset_a"))
    if isinstance(path, dict):  # the mix was saved with 0.1's absolute paths: same weights here
        weights = list(path.values())
        path = {str(HERE / "dataset_a"): weights[0], str(HERE / "dataset_b"): weights[1]}
    return ShardStreamDataset(path, **{**BASE, **options})


def assert_batches(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for key, value in w.items():
            assert np.array_equal(np.asarray(g[key]), value), f"batch {i}, {key}"


def test_a_0_1_state_under_the_token_bound_is_refused_naming_the_way_to_resume():
    ds = dataset({**CASES["concat"]["options"], "shuffle_tokens": 1 << 22})
    with pytest.raises(ResumeStateError, match="resume it exactly with shuffle_tokens=0"):
        ds.load_state_dict(CASES["concat"]["state"])


@pytest.mark.parametrize("name", ["concat", "greedy", "mix", "elastic"])
def test_dataset_states_of_0_1_resume_exactly(name):
    case = CASES[name]
    assert "format" not in case["state"]  # really a 0.1 state, without the envelope
    ds = dataset(case["options"])
    ds.load_state_dict(case["state"])
    want = expected(name)
    it = iter(ds)
    assert_batches([next(it) for _ in range(len(want))], want)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_loader_state_of_0_1_resumes_exactly(method):
    case = CASES["loader"]
    loader = ShardLoader(dataset(case["options"]), num_workers=2, multiprocessing_context=method)
    loader.load_state_dict(case["state"])
    want = expected("loader")
    it = iter(loader)
    assert_batches([next(it) for _ in range(len(want))], want)


def test_upgraded_state_is_the_current_envelope():
    ds = dataset(CASES["concat"]["options"])
    state = ds.upgrade_state(CASES["concat"]["state"])
    assert (state["format"], state["version"], state["kind"]) == ("shardtok.state", 2, "dataset")
    assert state["stream"]["kind"] == "slice_stream"
    assert state["stream"]["batcher"]["upstream"]["kind"] == "concat"
    fresh = dataset(CASES["concat"]["options"])
    fresh.load_state_dict(json.loads(json.dumps(state)))
    want = expected("concat")
    it = iter(fresh)
    assert_batches([next(it) for _ in range(len(want))], want)


def test_cli_state_file_of_0_1_resumes_exactly(tmp_path):
    out = tmp_path / "rest.npz"
    state = tmp_path / "state.json"
    state.write_text((HERE / "cli_state.json").read_text())
    args = ["stream", str(HERE / "dataset_a"), "--seq-len", "16", "--batch-size", "2",
            "--seed", "3", "--shuffle-buffer", "32", "--num-workers", "2"]  # fmt: skip
    resume = [*args, "--max-batches", "5", "--state-in", str(state), "--dump", str(out)]
    # The shuffle buffer's token bound came after 0.1: such a state says how to resume it.
    with pytest.raises(ResumeStateError, match="--shuffle-tokens 0"):
        cli(resume)
    assert cli([*resume, "--shuffle-tokens", "0"]) == 0
    got, want = np.load(out), np.load(HERE / "cli.npz")
    for key in ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens"):
        assert np.array_equal(got[key], want[key]), key


def test_a_state_from_a_newer_release_is_refused_with_both_versions():
    ds = dataset(CASES["concat"]["options"])
    state = ds.upgrade_state(CASES["concat"]["state"])
    state["version"] = 3
    with pytest.raises(ResumeStateError, match="version 3 .* reads version 2"):
        ds.load_state_dict(state)
