"""Class 13: a resume state is someone else's input too. Hand-edited positions, a loader state
missing a worker, a state of another kind or release: refused naming the field, never resumed
into other batches. (More cases: tests/stream/test_states.py, tests/torch/test_save_restore.py.)"""

from __future__ import annotations

import copy
import json

import pytest

from shardtok.errors import ResumeStateError
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardLoader, ShardStreamDataset

OPTIONS = dict(seq_len=31, batch_size=2, shuffle_buffer=16, seed=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("states")
    write_synthetic_dataset(path, num_tokens=20_000, vocab_size=1000, mean_length=50,
                            shard_size=4000, frame_size=1000)  # fmt: skip
    return path


def saved(data, batches=5):
    ds = ShardStreamDataset(data, **OPTIONS)
    it = iter(ds)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(ds.state_dict()))


def paths_to_ints(state, prefix=()):
    """Every (path, value) of an integer field anywhere in a state."""
    if isinstance(state, dict):
        for key, value in state.items():
            yield from paths_to_ints(value, (*prefix, key))
    elif isinstance(state, list):
        for i, value in enumerate(state):
            yield from paths_to_ints(value, (*prefix, i))
    elif isinstance(state, int) and not isinstance(state, bool):
        yield prefix, state


def test_a_negative_number_anywhere_is_refused(data):
    state = saved(data)
    fields = [p for p, _ in paths_to_ints(state["stream"])]
    assert len(fields) >= 10
    for path in fields:
        damaged = copy.deepcopy(state)
        holder = damaged["stream"]
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = -1
        with pytest.raises(ResumeStateError):
            ShardStreamDataset(data, **OPTIONS).load_state_dict(damaged)


def test_a_loader_state_without_a_worker_is_refused(data):
    loader = ShardLoader(ShardStreamDataset(data, **OPTIONS), num_workers=2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    state["workers"].pop()
    fresh = ShardLoader(ShardStreamDataset(data, **OPTIONS), num_workers=2)
    with pytest.raises(ResumeStateError, match="every worker's position is needed"):
        fresh.load_state_dict(state)


def test_a_state_of_another_kind_or_release_is_refused(data):
    state = saved(data)
    for edit, message in (
        (lambda s: s.__setitem__("kind", "loader"), "'loader' state"),
        (lambda s: s.__setitem__("version", 99), "version 99"),
        (lambda s: s["stream"].__setitem__("kind", "mixed_stream"), "mix"),
        (lambda s: s["stream"]["batcher"].pop("upstream"), "'upstream' is missing"),
    ):
        damaged = copy.deepcopy(state)
        edit(damaged)
        with pytest.raises(ResumeStateError, match=message):
            ShardStreamDataset(data, **OPTIONS).load_state_dict(damaged)


# --- issue 36: numbers in a state, or on the command line, from someone else ---------------


@pytest.fixture(scope="module")
def second(tmp_path_factory):
    path = tmp_path_factory.mktemp("states_b")
    write_synthetic_dataset(path, num_tokens=6_000, vocab_size=1000, mean_length=50,
                            shard_size=2000, frame_size=1000)  # fmt: skip
    return path


MIX = {**OPTIONS, "num_batches": 1000}


def mix_saved(data, second, batches=5):
    ds = ShardStreamDataset({str(data): 0.7, str(second): 0.3}, **MIX)
    it = iter(ds)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(ds.state_dict())), ds


def mix_parts(state):
    """The mix_sequences state inside a saved mix dataset state."""
    return state["stream"]["batcher"]["upstream"]


@pytest.mark.parametrize("step", [10**8, 10**9])
def test_a_mix_step_its_sources_did_not_serve_is_refused(data, second, step):
    state, _ = mix_saved(data, second)
    mix_parts(state)["step"] = step
    with pytest.raises(ResumeStateError, match="field 'step' is .* sources served"):
        ds = ShardStreamDataset({str(data): 0.7, str(second): 0.3}, **MIX)
        ds.load_state_dict(state)
        next(iter(ds))


FAR_RESUME = """
import json, resource, sys
from shardtok.torch import ShardStreamDataset
state = json.loads(sys.argv[3])
ds = ShardStreamDataset({sys.argv[1]: 0.7, sys.argv[2]: 0.3}, **json.loads(sys.argv[4]))
ds.load_state_dict(state)
next(iter(ds))
"""


def test_a_far_mix_step_resumes_in_the_memory_of_a_near_one(data, second):
    """A step its sources did serve (each source's count edited with it) is a position like any
    other: resuming it costs a block of the schedule, not 10 bytes per step before it."""
    import resource
    import subprocess
    import sys

    state, _ = mix_saved(data, second)
    mix = mix_parts(state)
    extra = 10**9 - mix["step"]
    mix["step"] = 10**9
    mix["sources"][0]["sequences"] += extra
    proc = subprocess.run(
        [sys.executable, "-c", FAR_RESUME, str(data), str(second), json.dumps(state),
         json.dumps(MIX)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 1_000_000  # KiB: 1 GB


def test_the_schedule_at_any_step_is_the_blending_rule():
    import numpy as np

    from shardtok.index import build_blending_indices
    from shardtok.stream.mix.schedule import MixSchedule

    for weights in ([0.7, 0.3], [1, 1, 7], [0.123457, 0.876543], [5, 3, 2, 1, 1]):
        expected, _ = build_blending_indices(weights, None, 250_000)
        schedule = MixSchedule(weights)
        for step in (0, 1, 9, 10, 123_457, 249_999, 17, 200_000, 3):  # backwards too
            assert schedule[step] == expected[step]
            assert (
                schedule.counts(step)
                == np.bincount(expected[:step], minlength=len(weights)).tolist()
            )
    # A far step is arithmetic once the order's period is known: no prefix is materialised.
    schedule = MixSchedule([0.7, 0.3])
    assert schedule.counts(10**15) == [7 * 10**14, 3 * 10**14]
    assert schedule[10**15 + 3] == schedule[3]
    assert schedule._block.nbytes <= MixSchedule.BLOCK * 2


def run_cli(args):
    """(exit status, stderr) of `shardtok ARGS` in a fresh process."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "shardtok", *args], capture_output=True, text=True)
    return proc.returncode, proc.stderr


def test_a_step_or_batch_count_past_any_run_is_a_usage_error(data, second, tmp_path):
    config = tmp_path / "mix.yaml"
    config.write_text(f"seq_len: 31\nbatch_size: 2\ndataset_path: {{{data}: 0.7, {second}: 0.3}}\n")
    for args in (
        ["stream", "--config", str(config), "--plan", "--max-batches", str(10**15)],
        ["trace", str(config), "--step", str(10**20), "--num-workers", "0"],
        ["trace", str(config), "--step", "3", "--max-batches", str(10**20), "--num-workers", "0"],
    ):
        status, err = run_cli(args)
        assert status == 2, err
        assert len(err.strip().splitlines()) == 1 and "bug" not in err, err
        assert "more than shardtok counts steps to" in err, err


def test_a_preview_that_would_walk_too_many_epochs_is_a_usage_error(data, second, monkeypatch):
    from shardtok.errors import UsageError
    from shardtok.stream import preview
    from shardtok.stream.mix.spec import mix_spec
    from shardtok.stream.options import StreamOptions

    monkeypatch.setattr(preview, "MAX_EPOCHS", 20)
    spec = mix_spec({str(data): 0.7, str(second): 0.3})
    options = StreamOptions(seq_len=31, batch_size=2)
    assert preview.mix_preview(spec, options, max_batches=10)["stages"]
    with pytest.raises(UsageError, match="more than 20 of its epochs"):
        preview.mix_preview(spec, options, max_batches=10_000)


def test_a_retyped_kind_or_an_ordinal_past_the_pieces_is_a_resume_state_error(data):
    """Found by tests/adversarial/test_fuzz_states.py: a TypeError and a ValueError escaped."""
    state = saved(data)
    for edit in (
        lambda s: s["stream"]["batcher"].__setitem__("kind", ["batcher"]),
        lambda s: reader_of(s).__setitem__("ordinal", 2**70),
    ):
        damaged = copy.deepcopy(state)
        edit(damaged)
        ds = ShardStreamDataset(data, **OPTIONS)
        with pytest.raises(ResumeStateError):
            ds.load_state_dict(damaged)
            next(iter(ds))


def reader_of(state):
    node = state["stream"]["batcher"]
    while node["kind"] != "reader":
        node = node["upstream"]
    return node


def node_of(state, kind):
    node = state["stream"]["batcher"]
    while node["kind"] != kind:
        node = node["upstream"]
    return node


@pytest.mark.parametrize("kind, field, value", [("shuffle", "position", 10**6),
                                                ("concat", "skip", 10**6)])  # fmt: skip
def test_a_position_past_what_the_state_can_name_is_refused(data, kind, field, value):
    """A shuffle position beyond its checkpoint's reach would buffer the slice up to it; a skip
    past the document it names would cut rows of other lengths (a ValueError from the packer)."""
    state = saved(data)
    node_of(state, kind)[field] = value
    ds = ShardStreamDataset(data, **OPTIONS)
    with pytest.raises(ResumeStateError, match=f"field '{field}'"):
        ds.load_state_dict(state)
        next(iter(ds))
