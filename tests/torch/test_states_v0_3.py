"""States written by shardtok 0.3.0 resume bit-exactly (the promise in docs/RESUME.md).

tests/fixtures/v0_3/ holds what 0.3.0 (commit 9b45403) itself wrote (see make_fixtures.py
there): the states it saved after a few batches and the batches it yielded after restoring
each of them in a fresh dataset or loader. The cases: one dataset in process under concat,
greedy and bfd packing, a weighted mix, fine-tuning data with loss masks, one dataset over an
epoch boundary (``epochs_stream``), two curriculum stages after the switch (``staged_stream``),
an elastic state (2 ranks merged, run on by one: ``elastic_stream``), a 2-worker ShardLoader,
torchdata's StatefulDataLoader with 2 workers, and the CLI's state file. The datasets are
v0_1's (dataset_a, dataset_b) and dataset_sft beside the states; paths in the states and
options are relative to tests/fixtures/v0_3/ and are resolved here.
"""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from shardtok.cli.main import run as cli
from shardtok.torch import ShardLoader, ShardStreamDataset

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "v0_3"
CASES = json.loads((HERE / "states.json").read_text())
BASE = dict(seq_len=16, batch_size=2, seed=3, shuffle_buffer=32)
DATASET_CASES = ["concat", "greedy", "bfd", "mix", "masked", "epochs", "stages", "elastic"]
METHODS = ["fork", "forkserver", "spawn"]


def here(path: str) -> str:
    """A path as stored (relative to the fixtures folder) made absolute."""
    return str((HERE / path).resolve())


def located(path: str | dict) -> str | dict:
    """A dataset path or a mix's {path: weight} with its paths made absolute."""
    return {here(k): v for k, v in path.items()} if isinstance(path, dict) else here(path)


def resolved(options: dict) -> dict:
    """A case's options with their dataset paths (a path, a mix, a config's stages) resolved."""
    options = copy.deepcopy(options)
    if "config" in options:
        # 0.3.0's stages restarted their sources at every switch (Nanotron's rule); a release
        # with the stage_switch option resumes its states under "restart" (0.3.0 ignores it).
        options["config"]["stage_switch"] = "restart"
        for stage in options["config"]["data_stages"]:
            named = stage["data"]["dataset"]
            named["dataset_path"] = located(named["dataset_path"])
    else:
        options["path"] = located(options.get("path", "../v0_1/dataset_a"))
    return options


def dataset(options: dict) -> ShardStreamDataset:
    options = resolved(options)
    if "config" in options:
        return ShardStreamDataset.from_config(options.pop("config"), **options)
    return ShardStreamDataset(options.pop("path"), **{**BASE, **options})


def expected(name: str) -> list[dict]:
    data = np.load(HERE / f"{name}.npz")
    out: dict[int, dict] = {}
    for key in data.files:
        i, field = key.split("/")
        out.setdefault(int(i), {})[field] = data[key]
    return [out[i] for i in sorted(out)]


def assert_batches(got: list[dict], want: list[dict]) -> None:
    """Every field 0.3.0 yielded, with its dtype and every value."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for key, value in w.items():
            assert key in g, f"batch {i}: no {key}"
            mine = np.asarray(g[key])
            assert mine.dtype == value.dtype, f"batch {i}, {key}: {mine.dtype} != {value.dtype}"
            assert np.array_equal(mine, value), f"batch {i}, {key}"


def take(it, n: int) -> list[dict]:
    return [{k: np.asarray(v).copy() for k, v in next(it).items()} for _ in range(n)]


def locations(value: object) -> list[str]:
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "location"] + [
            loc for v in value.values() for loc in locations(v)
        ]
    return [loc for v in value for loc in locations(v)] if isinstance(value, list) else []


def test_the_fixtures_are_states_of_0_3_with_relative_paths():
    cli_state = json.loads((HERE / "cli_state.json").read_text())
    found = locations(CASES) + locations(cli_state)
    assert found and all(not Path(loc).is_absolute() for loc in found), sorted(set(found))
    for name in DATASET_CASES:
        envelope = {k: CASES[name]["state"][k] for k in ("format", "version", "kind")}
        assert envelope == {"format": "shardtok.state", "version": 2, "kind": "dataset"}, name
    kinds = {name: CASES[name]["state"]["stream"]["kind"] for name in DATASET_CASES}
    assert kinds["mix"] == "mixed_stream" and kinds["elastic"] == "elastic_stream"
    assert kinds["epochs"] == "epochs_stream" and CASES["epochs"]["state"]["stream"]["current"] == 1
    assert kinds["stages"] == "staged_stream" and CASES["stages"]["state"]["stream"]["stage"] == 1


@pytest.mark.parametrize("name", DATASET_CASES)
def test_dataset_states_of_0_3_resume_exactly(name):
    case = CASES[name]
    ds = dataset(case["options"])
    ds.load_state_dict(case["state"])
    want = expected(name)
    assert_batches(take(iter(ds), len(want)), want)


@pytest.mark.parametrize("method", METHODS)
def test_shard_loader_state_of_0_3_resumes_exactly(method):
    case = CASES["loader"]
    loader = ShardLoader(
        dataset(case["options"]), num_workers=case["num_workers"], multiprocessing_context=method
    )
    loader.load_state_dict(case["state"])
    want = expected("loader")
    assert_batches(take(iter(loader), len(want)), want)


@pytest.mark.parametrize("method", METHODS)
def test_stateful_dataloader_state_of_0_3_resumes_exactly(method):
    from torchdata.stateful_dataloader import StatefulDataLoader

    case = CASES["stateful"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata's own deprecation notices
        loader = StatefulDataLoader(
            dataset(case["options"]), batch_size=None, num_workers=case["num_workers"],
            multiprocessing_context=method,
        )  # fmt: skip
        loader.load_state_dict(case["state"])
        want = expected("stateful")
        assert_batches(take(iter(loader), len(want)), want)


def test_cli_state_file_of_0_3_resumes_exactly(tmp_path):
    out, state = tmp_path / "rest.npz", tmp_path / "state.json"
    shutil.copyfile(HERE / "cli_state.json", state)
    args = ["stream", here("../v0_1/dataset_a"), "--seq-len", "16", "--batch-size", "2",
            "--seed", "3", "--shuffle-buffer", "32", "--num-workers", "2"]  # fmt: skip
    assert cli([*args, "--max-batches", "5", "--state-in", str(state), "--dump", str(out)]) == 0
    got, want = np.load(out), np.load(HERE / "cli.npz")
    batch_fields = [key for key in want.files if key != "plan"]  # plan: the epoch plan's JSON
    assert "input_ids" in batch_fields and "source_ids" in batch_fields
    for key in batch_fields:
        assert got[key].dtype == want[key].dtype, key
        assert np.array_equal(got[key], want[key]), key
