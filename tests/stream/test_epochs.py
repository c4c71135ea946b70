"""`num_batches` on one dataset: epoch after epoch (``EpochsStream``), its exact and elastic
resume, and ``locate``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.stream.epochs import EpochsStream
from shardtok.stream.factory import StreamSetup
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, WorkerState, parse_saved
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset

OPTIONS = StreamOptions(seq_len=15, batch_size=2, shuffle_buffer=8, seed=4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("epochs")
    lengths = [int(n) for n in np.random.default_rng(1).integers(1, 60, size=60)]
    write_synthetic_dataset(
        path, lengths=lengths, vocab_size=1 << 20, unique_tokens=True, first_token=1,
        shard_size=400, frame_size=200,
    )  # fmt: skip
    return StreamSetup.single(DatasetSource(str(path)), OPTIONS)


def same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key], b[key]), key


def where(worker: int, workers: int) -> Placement:
    return Placement(0, 1, worker, workers)


def epoch_batches(setup, epoch: int, worker: int, workers: int) -> list[dict]:
    return take(setup.stream(where(worker, workers), epoch=epoch))


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize("worker", [0, 1])
def test_num_batches_runs_on_through_epochs_each_its_own_slice(setup, worker):
    per_epoch = [len(setup.stream(where(worker, 2), epoch=e)) for e in (1, 2, 3)]
    count = per_epoch[0] + per_epoch[1] + per_epoch[2] // 2  # two and a half epochs
    stream = setup.stream(where(worker, 2), epoch=1, num_batches=count)
    assert isinstance(stream, EpochsStream) and len(stream) == count
    want = [b for e in (1, 2, 3) for b in epoch_batches(setup, e, worker, 2)][:count]
    same(take(stream), want)
    with pytest.raises(StopIteration):
        next(stream)
    # A stream without num_batches is the plain epoch, as before.
    assert isinstance(setup.stream(where(worker, 2), epoch=1), SliceStream)


def test_exact_resume_mid_epoch_and_at_the_boundary(setup):
    first = len(setup.stream(where(0, 2), epoch=0))
    count = 2 * first + 3
    whole = take(setup.stream(where(0, 2), epoch=0, num_batches=count))
    for at in (first - 1, first, first + 1, first + first // 2):
        stream = setup.stream(where(0, 2), epoch=0, num_batches=count)
        take(stream, at)
        state = roundtrip(stream.state_dict())
        # Lazy switch: at the boundary the state is still epoch 0's, at its end.
        assert state["current"] == (0 if at <= first else 1) and state["batches"] == at
        resumed = setup.stream(where(0, 2), epoch=0, resume=state, num_batches=count)
        same(take(resumed), whole[at:])
    fresh = setup.stream(where(0, 2), epoch=0, num_batches=count).state_dict()
    assert fresh["slice"] is None and fresh["current"] == 0


def test_states_are_checked(setup):
    stream = setup.stream(where(1, 2), epoch=0, num_batches=50)
    take(stream, 30)
    state = roundtrip(stream.state_dict())
    with pytest.raises(ResumeStateError, match="worker"):
        setup.stream(where(0, 2), epoch=0, resume=state, num_batches=50)
    with pytest.raises(ResumeStateError, match="'batches' is 29"):
        setup.stream(where(1, 2), epoch=0, resume={**state, "batches": 29}, num_batches=50)
    # Without num_batches the state's stream goes on to the end of the epoch it is in.
    per_epoch = len(setup.stream(where(1, 2), epoch=0))
    rest = take(setup.stream(where(1, 2), epoch=0, resume=state))
    assert len(rest) == -(-30 // per_epoch) * per_epoch - 30
    # A state saved as one epoch (before num_batches ran on) still resumes as that epoch.
    one = setup.stream(where(1, 2), epoch=0)
    take(one, 3)
    again = setup.stream(where(1, 2), epoch=0, resume=one.state_dict(), num_batches=50)
    assert isinstance(again, SliceStream)


def test_locate_names_the_epoch_and_its_batch(setup):
    lengths = [len(setup.stream(where(0, 2), epoch=e)) for e in (0, 1, 2)]
    count = sum(lengths)
    whole = take(setup.stream(where(0, 2), epoch=0, num_batches=count))
    stream = setup.stream(where(0, 2), epoch=0, num_batches=count)
    take(stream, lengths[0] - 2)
    for local in (lengths[0] - 2, lengths[0], lengths[0] + lengths[1] + 1):
        located = stream.locate(local)
        assert located.part == {"epoch": sum(local >= sum(lengths[: k + 1]) for k in (0, 1))}
        part = setup.stream(where(0, 2), epoch=located.part["epoch"])
        if located.stream is not stream.part:  # a later epoch: fresh at its start
            assert located.stream.state_dict() == part.state_dict()
        take(located.stream, located.skip)
        same([next(located.stream)], [whole[local]])
        stream = setup.stream(where(0, 2), epoch=0, num_batches=count)
        take(stream, lengths[0] - 2)
    with pytest.raises(ValueError):
        stream.locate(count)


def run_old(setup, steps: int, workers: int, count: int):
    """`steps` rank steps of a 1-rank layout with `workers` workers (round robin): the
    dataset states a checkpoint holds, and the batches."""
    streams = [setup.stream(where(w, workers), epoch=0, num_batches=count) for w in range(workers)]
    batches = [next(streams[s % workers]) for s in range(steps)]
    states = [
        WorkerState(0, where(w, workers), roundtrip(s.state_dict()), setup.fingerprint).to_dict()
        for w, s in enumerate(streams)
    ]
    return states, batches


def expected_after_merge(setup, steps: int, workers: int, new_workers: int, worker: int):
    """The rule, built by hand: the old workers' progress inside the epoch of step `steps`
    (the slices of workers not yet in it untouched), that epoch's remainder in the new layout,
    then the next epoch fresh."""
    lengths = [len(setup.stream(where(0, workers), epoch=e)) for e in (0, 1)]
    local, ahead = divmod(steps, workers)
    epoch = 0 if local < lengths[0] else 1
    begin = 0 if epoch == 0 else lengths[0]
    states = []
    for w in range(workers):
        done = local + (w < ahead) - begin
        stream = setup.stream(where(w, workers), epoch=epoch)
        take(stream, max(done, 0))
        state = stream.state_dict() if done > 0 else None
        states.append(WorkerState(epoch, where(w, workers), state, setup.fingerprint).to_dict())
    merged = parse_saved(merge_states(states))
    remainder = take(setup.stream(where(worker, new_workers), epoch=epoch, resume=merged))
    return epoch, remainder + epoch_batches(setup, epoch + 1, worker, new_workers)


@pytest.mark.parametrize("steps", ["mid-epoch-1", "boundary"])
def test_elastic_merge_continues_the_epoch_of_the_step(setup, steps):
    first = len(setup.stream(where(0, 2), epoch=0))
    steps = 2 * first + 5 if steps == "mid-epoch-1" else 2 * first
    states, _ = run_old(setup, steps, 2, 10 * first)
    merged = merge_states(states)
    assert merged["kind"] == "merged" and merged["elastic"]["step"] == steps
    for worker in range(3):
        epoch, want = expected_after_merge(setup, steps, 2, 3, worker)
        assert epoch == 1
        stream = setup.stream(where(worker, 3), epoch=0, resume=parse_saved(merged),
                              num_batches=len(want))  # fmt: skip
        assert stream.first_part == 1 and stream.first_step == steps
        same(take(stream), want)


def test_merging_again(setup):
    first = len(setup.stream(where(0, 2), epoch=0))
    steps = 2 * first + 3  # in epoch 1
    states, _ = run_old(setup, steps, 2, 10 * first)
    merged = parse_saved(merge_states(states))
    stream = setup.stream(where(0, 1), epoch=0, resume=merged, num_batches=10 * first)
    remainder = len(stream.part)

    def saved() -> list[dict]:
        state = roundtrip(stream.state_dict())
        return [WorkerState(0, where(0, 1), state, setup.fingerprint).to_dict()]

    take(stream, remainder - 1)
    with pytest.raises(ResumeStateError, match="still in the remainder"):
        merge_states(saved())
    take(stream, 2)  # one batch into epoch 2: the remainder is done
    again = merge_states(saved())
    layout = again["elastic"]
    assert layout["step"] == steps + remainder + 1 and layout["first_step"] == steps
    assert layout["parts"] == [{"epoch": 2, "begin": remainder, "batches": remainder + 1}]
    resumed = setup.stream(where(1, 2), epoch=0, resume=parse_saved(again), num_batches=5)
    assert resumed.first_part == 2 and len(take(resumed)) == 5


def test_merge_refuses_workers_off_the_round_robin(setup):
    states, _ = run_old(setup, 7, 2, 50)
    other, _ = run_old(setup, 11, 2, 50)
    with pytest.raises(ResumeStateError, match="round robin"):
        merge_states([states[0], other[1]])


def test_cli_max_batches_runs_on_into_later_epochs(setup, tmp_path, capsys):
    from shardtok.cli.main import run as main

    first = len(setup.stream(where(0, 1), epoch=0))
    args = ["stream", setup.sources[0].location, "--seq-len", "15", "--batch-size", "2",
            "--shuffle-buffer", "8", "--seed", "4"]  # fmt: skip
    state = tmp_path / "s.json"
    dump = tmp_path / "a.npz"
    assert main([*args, "--max-batches", str(first + 5), "--dump", str(dump),
                 "--state-out", str(state)]) == 0  # fmt: skip
    assert f"streamed {first + 5:,} ({first:,} per epoch) batches" in capsys.readouterr().out
    whole = take(setup.stream(where(0, 1), epoch=0, num_batches=first + 8))
    assert np.array_equal(np.load(dump)["input_ids"], [b["input_ids"] for b in whole[:-3]])
    assert main([*args, "--max-batches", "3", "--state-in", str(state), "--dump", str(dump)]) == 0
    assert np.array_equal(np.load(dump)["input_ids"], [b["input_ids"] for b in whole[-3:]])
    # A state of one epoch (no --max-batches: kind slice_stream) still ends with that epoch.
    assert main([*args, "--state-out", str(state)]) == 0
    assert json.loads(state.read_text())["workers"][0]["kind"] == "slice_stream"
    capsys.readouterr()
    assert main([*args, "--max-batches", "3", "--state-in", str(state), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == 0


def test_cli_state_after_an_elastic_resume_counts_the_steps_before_it(setup, tmp_path, capsys):
    """The state file's steps (and so a trace from it) include the steps before the merge."""
    from shardtok.cli.main import run as main
    from shardtok.stream.provenance import trace_step
    from tests.helpers.provenance import assert_reproduces, shard_documents

    first = len(setup.stream(where(0, 2), epoch=0))
    args = ["stream", setup.sources[0].location, "--seq-len", "15", "--batch-size", "2",
            "--shuffle-buffer", "8", "--seed", "4"]  # fmt: skip
    steps = first + 3  # into epoch 1
    for rank in (0, 1):
        assert main([*args, "--world-size", "2", "--rank", str(rank), "--max-batches", str(steps),
                     "--state-out", str(tmp_path / f"r{rank}.json")]) == 0  # fmt: skip
    merged, dump = tmp_path / "m.json", tmp_path / "next.npz"
    assert main([*args, "--max-batches", "2", "--state-in", str(tmp_path / "r0.json"),
                 "--state-in", str(tmp_path / "r1.json"), "--state-out", str(merged)]) == 0  # fmt: skip
    assert json.loads(merged.read_text())["batches"] == steps + 2
    assert main([*args, "--max-batches", "1", "--state-in", str(merged), "--dump", str(dump)]) == 0
    capsys.readouterr()
    state = json.loads(merged.read_text())
    trace = trace_step(setup, step=steps + 3, rank=0, world_size=1, num_workers=0,
                       num_batches=10 * first, state=state)  # fmt: skip
    batch = {k: np.load(dump)[k][0] for k in ("input_ids", "labels")}
    assert_reproduces(trace, batch, shard_documents(list(setup.sources)))
