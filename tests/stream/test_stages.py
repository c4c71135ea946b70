"""Curriculum stages: each step's batch from its stage's fresh mix, exact and elastic resume, the
fingerprint rule, and the CLI. Token ids tell the sources apart (tests/helpers/stages.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardtok.cli.main import run as main
from shardtok.errors import ResumeStateError, ShardtokError, UsageError
from shardtok.stream.factory import StreamSetup, check_stream_state
from shardtok.stream.mix.spec import load_mix_config
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.fingerprint import check_fingerprint
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, WorkerState, parse_saved, saved_position
from shardtok.testing.save_restore import assert_items_equal, check_save_restore
from tests.helpers.stages import changed, config, source_of, write_config, write_sources

STAGE_SOURCES = [{0}, {0, 1}, {1, 2}]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("stages"))


@pytest.fixture(scope="module")
def base(paths):
    return config(paths)


def setup_of(data: dict) -> StreamSetup:
    curriculum = load_curriculum(data)
    return StreamSetup.staged(curriculum, StreamOptions(**curriculum.options))


def rank_batches(setup, rank, world, workers, steps, resume=None, num_batches=None):
    """A rank's `steps` batches, its workers taken round-robin (as the DataLoader does)."""
    streams = [
        setup.stream(Placement(rank, world, w, workers), epoch=0, num_batches=num_batches,
                     resume=resume[w] if isinstance(resume, list) else resume)
        for w in range(workers)
    ]  # fmt: skip
    return [next(streams[t % workers]) for t in range(steps)], streams


def by_the_rule(setup, rank, world, workers, steps, first_step=0):
    """What the stage rule says rank steps first_step.. are: step t of worker w = (t - T0) % K,
    local batch j, is batch j - begin of a fresh MixedStream of t's stage for that worker."""
    curriculum, streams, out = setup.curriculum, {}, []
    for t in range(first_step, first_step + steps):
        w, j = (t - first_step) % workers, (t - first_step) // workers
        k = curriculum.stage_of_step(t + 1)
        if (k, w) not in streams:
            streams[k, w] = MixedStream(
                curriculum.stages[k].mix, curriculum.options_for(k, setup.options), rank=rank,
                world_size=world, worker=w, num_workers=workers,
                source_ids=curriculum.source_ids(k),
            )  # fmt: skip
        assert (
            streams[k, w].batcher.batches == j - curriculum.local_begins(first_step, w, workers)[k]
        )
        out.append(next(streams[k, w]))
    return out


def assert_same(got, expected):
    assert len(got) == len(expected)
    for t, (a, b) in enumerate(zip(got, expected)):
        assert_items_equal(a, b, f"step {t}")


def sources_by_step(batches, first_step=0):
    return {
        first_step + t: {source_of(row) for row in b["input_ids"]} for t, b in enumerate(batches)
    }


def renamed(data: dict) -> dict:
    data = changed(data, 2)
    data["data_stages"][2]["name"] = "blend"
    return data


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: changed(d, 0, start=2), r"first data stage \('warmup'\) must start at step 1"),
        (lambda d: changed(d, 2, start=4), r"'code' starts at step 4, not after 'blend'"),
        (renamed, "two data stages are named 'blend'"),
        (
            lambda d: changed(d, 1, ("dataset", "shuffle_buffer"), 4),
            r"stage 'warmup' sets shuffle_buffer=8",
        ),
    ],
)
def test_config_errors_are_one_line(base, edit, message):
    data = edit(base)
    with pytest.raises(ShardtokError, match=message) as error:
        load_curriculum(data)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("world, rank, workers", [(1, 0, 1), (1, 0, 2), (2, 1, 2)])
def test_every_step_comes_from_its_stage(base, world, rank, workers):
    setup = setup_of(base)
    got, _ = rank_batches(setup, rank, world, workers, 10, num_batches=10 // workers)
    assert_same(got, by_the_rule(setup, rank, world, workers, 10))
    for t, owners in sources_by_step(got).items():
        assert owners <= STAGE_SOURCES[setup.curriculum.stage_of_step(t + 1)], t
    assert sources_by_step(got)[9] & {2}  # stage "code" really reads its own source


def test_rows_name_curriculum_wide_sources_and_locate_finds_them(base):
    setup = setup_of(base)
    assert setup.curriculum.source_ids(2) == [1, 2]  # "code": s1 and s2, not its indices 0, 1
    batches, (stream,) = rank_batches(setup, 0, 1, 1, 5, num_batches=9)
    here = stream.locate(5)  # the live stage-1 stream, where it stands
    assert (here.stream, here.skip, here.part) == (stream._mix, 0, {"stage": 1})
    later = stream.locate(7)  # stage 2: a fresh stream, one batch in
    assert (later.skip, later.part) == (1, {"stage": 2})
    expected = by_the_rule(setup, 0, 1, 1, 8)[7]["input_ids"]
    mixer = later.stream.batcher.upstream
    row = np.empty(setup.options.seq_len + 1, dtype=np.int64)
    rows, ids = [], []
    for _ in range(2 * setup.options.batch_size):
        _, length = mixer.next_into(row)
        rows.append(row[: setup.options.seq_len].copy())
        ids.append(mixer.row_source)
        assert mixer.row_source == source_of(row[:length])
    assert np.array_equal(np.stack(rows[2:]), expected)
    with pytest.raises(ValueError, match="before this stream's position"):
        stream.locate(4)


def test_save_restore_across_both_boundaries(base):
    setup = setup_of(base)
    # worker 1 of 2: local batch 0 in stage 0, 1-2 in stage 1, 3 on in stage 2
    assert setup.curriculum.local_begins(0, 1, 2) == [0, 1, 3]
    check_save_restore(
        lambda: setup.stream(Placement(1, 2, 1, 2), epoch=0, num_batches=6),
        midpoints=(0, 1, 2, 3, 4, -1),
        max_state_bytes=8192,
    )


def test_fingerprint_rule(base, paths):
    setup = setup_of(base)
    _, (stream,) = rank_batches(setup, 0, 1, 1, 5)
    state = stream.state_dict()
    at = saved_position(state)
    assert at == {"stage": 1, "step": 5}

    def problems(data):
        return check_fingerprint(setup.fingerprint, setup_of(data).fingerprint, strict=False, **at)

    later = changed(base, 2, ("dataset", "dataset_path"), {paths[1]: 0.9, paths[2]: 0.1})
    more = {**base, "data_stages": [*base["data_stages"], {**base["data_stages"][0],
            "name": "again", "start_training_step": 20}]}  # fmt: skip
    for ok in (later, changed(base, 2, ("seed",), 5), changed(base, 2, start=6), more):
        assert problems(ok) == []
    refused = {
        "stage 2 ('code') now starts at step 5, at or before step 5, which the state reached in "
        "stage 1 ('blend')": changed(base, 2, start=5),
        "stage 1 ('blend'): start_training_step 4 saved, 3 now": changed(base, 1, start=3),
        "stage 1 ('blend'): source 1": changed(
            base, 1, ("dataset", "dataset_path"), {paths[0]: 0.5, paths[1]: 0.4}
        ),
        "stage 0 ('warmup'): seed 3 saved, 5 now": changed(base, 0, ("seed",), 5),
        "option seq_len: 15 saved, 17 now": {**base, "seq_len": 17},
    }
    for message, data in refused.items():
        found = problems(data)
        assert any(p.startswith(message) for p in found), (message, found)
        with pytest.raises(ResumeStateError, match="resume state was saved for other"):
            check_fingerprint(setup.fingerprint, setup_of(data).fingerprint, **at)
    # a later stage changed: stage 1 continues exactly, then the new stage 2 from its start
    resumed = setup_of(later)
    got, _ = rank_batches(resumed, 0, 1, 1, 5, resume=state)
    assert_same(got[:1], by_the_rule(setup, 0, 1, 1, 6)[5:])
    assert_same(got[1:], by_the_rule(resumed, 0, 1, 1, 10)[6:])


def old_layout(setup, world, workers, steps):
    """Every rank's `steps` batches and its workers' dataset states (as JSON would hold them)."""
    batches, states = [], []
    for rank in range(world):
        mine, streams = rank_batches(setup, rank, world, workers, steps)
        batches += mine
        for w, s in enumerate(streams):
            state = WorkerState(0, Placement(rank, world, w, workers), s.state_dict(),
                                setup.fingerprint)  # fmt: skip
            states.append(json.loads(json.dumps(state.to_dict())))
    return batches, states


def test_elastic_within_a_stage_then_the_next_stage_on_time(base):
    """2 ranks x 1 worker save after 5 steps (stage 'blend' is steps 4-6); 1 rank x 2 workers
    continue: stage 1's sources finish their epochs without a token twice or skipped, and step 7
    (0-based 6) on is stage 'code', fresh, exactly by the rule from step 5."""
    setup = setup_of(base)
    before, states = old_layout(setup, 2, 1, 5)
    merged = parse_saved(merge_states(states))
    assert (merged.kind, merged.stage, merged.step) == ("merged_stages", 1, 5)
    check_fingerprint(merged.fingerprint, setup.fingerprint, **saved_position(merged))
    after, streams = rank_batches(setup, 0, 1, 2, 5, resume=merged)
    stage1 = streams[0].part(1)  # new worker 0, stage 1: the merged remainder first
    assert streams[0].begins == [0, 0, 1] and streams[1].begins == [0, 0, 0]
    assert_same(after[:1], take(stage1, 1))
    assert_same(after[1:], by_the_rule(setup, 0, 1, 2, 5, first_step=5)[1:])
    assert all(s <= {1, 2} for t, s in sources_by_step(after, 5).items() if t >= 6)
    # stage 1's rows before the save plus every new slice's remainder: each token at most once,
    # all but a concat tail per new slice
    old_rows = [r for b in before[3:5] + before[8:10]
                for r in np.concatenate([b["input_ids"], b["labels"][:, -1:]], 1)]  # fmt: skip
    seen = {0: [], 1: []}
    for row in old_rows:
        seen[source_of(row)].append(row)
    spec = setup.curriculum.stages[1].mix
    for w in range(2):
        mix = MixedStream(spec, setup.curriculum.options_for(1, setup.options), worker=w,
                          num_workers=2, elastic=merged.layout)  # fmt: skip
        for i, source in enumerate(mix.mixer.sources):
            row = np.empty(source.window, dtype=np.int64)
            while True:
                _, length = source.next_into(row)
                if not source.in_remainder:
                    break
                seen[i].append(row[:length].copy())
    for i, total in ((0, 4000), (1, 3000)):
        got = np.concatenate(seen[i])
        assert len(np.unique(got)) == len(got), f"source {i}: a token twice"
        assert 0 <= total - len(got) < 2 * 16, f"source {i}: {total - len(got)} tokens skipped"
    # stage 1 of the new layout was itself resumed elastically: no second merge there, even
    # before its first batch...
    again = [WorkerState(0, Placement(0, 1, w, 2), s.state_dict(), setup.fingerprint).to_dict()
             for w, s in enumerate(streams)]  # fmt: skip
    assert [s["stream"]["stage"] for s in again] == [2, 2]  # ...but both are in stage 2 now
    merged_again = parse_saved(merge_states(again))
    assert (merged_again.stage, merged_again.step, merged_again.layout is not None) == (2, 10, True)
    fresh = [WorkerState(0, Placement(0, 1, w, 2), s.state_dict(), setup.fingerprint).to_dict()
             for w, s in enumerate(rank_batches(setup, 0, 1, 2, 0, resume=merged)[1])]  # fmt: skip
    with pytest.raises(ResumeStateError, match=r"stage 1 \('blend'\) of this state was itself"):
        merge_states(fresh)


def test_elastic_at_a_boundary_starts_the_stage_fresh(base):
    setup = setup_of(base)
    _, states = old_layout(setup, 2, 1, 6)  # step 7 (stage 'code') not taken by anyone
    merged = parse_saved(merge_states(states))
    assert (merged.stage, merged.step, merged.layout) == (2, 6, None)
    after, _ = rank_batches(setup, 0, 1, 2, 4, resume=merged)
    assert_same(after, by_the_rule(setup, 0, 1, 2, 4, first_step=6))
    uneven = [states[0], {**states[1], "stream": states[0]["stream"] | {"batches": 5, "rank": 1}}]
    with pytest.raises(ResumeStateError, match="rank 0 had taken 6 steps, rank 1 5"):
        merge_states(uneven)


def test_one_stage_config_is_todays_mix(base):
    one = {**base, "data_stages": [{**base["data_stages"][2], "start_training_step": 1}]}
    curriculum = load_curriculum(one)
    spec = curriculum.stage_spec(0)
    assert spec.options == {**base_options(base), "seed": 77}
    setup = StreamSetup.mixed(spec, StreamOptions(**spec.options))
    assert "stages" not in setup.fingerprint
    stream = setup.stream(Placement(0, 1, 0, 1), epoch=0, num_batches=4)
    todays = load_mix_config(one)  # what a config's stage 0 streamed before stages
    options = StreamOptions(**{**base_options(base), **todays.options})
    today = MixedStream(todays, options, num_batches=4)
    assert_same(take(stream), take(today))
    assert stream.state_dict() == today.state_dict()
    with pytest.raises(ValueError, match="one stage streams as a mix"):
        StreamSetup.staged(curriculum, StreamOptions(**spec.options))


def base_options(base):
    return {k: base[k] for k in ("seq_len", "batch_size", "shuffle_buffer", "seed")}


def test_cli_runs_all_stages_and_resumes_across_boundaries(base, paths, tmp_path, capsys):
    path = write_config(tmp_path / "stages.yaml", base)
    common = ["stream", "--config", str(path), "--num-workers", "2"]
    whole = tmp_path / "whole.npz"
    assert main([*common, "--max-batches", "10", "--dump", str(whole)]) == 0  # a DataLoader
    expected = np.load(whole)["input_ids"]
    assert_same(list(expected), [b["input_ids"] for b in by_the_rule(setup_of(base), 0, 1, 2, 10)])
    for k in (6, 7):  # right before stage 'code' (step 7) and right after its first step
        first, rest, state = (tmp_path / f"{n}{k}.{x}" for n, x in
                              (("first", "npz"), ("rest", "npz"), ("state", "json")))  # fmt: skip
        assert main([*common, "--max-batches", str(k), "--dump", str(first),
                     "--state-out", str(state)]) == 0  # fmt: skip
        assert json.loads(state.read_text())["batches"] == k
        assert main([*common, "--max-batches", str(10 - k), "--dump", str(rest),
                     "--state-in", str(state)]) == 0  # fmt: skip
        joined = np.concatenate([np.load(first)["input_ids"], np.load(rest)["input_ids"]])
        assert np.array_equal(joined, expected)
    out = capsys.readouterr().out
    assert f"source {paths[2]}: weight 70.00%" in out
    moved = write_config(tmp_path / "moved.yaml", changed(base, 2, start=6))
    with pytest.raises(ResumeStateError, match=r"stage 2 \('code'\) now starts at step 6"):
        main(["stream", "--config", str(moved), "--num-workers", "2", "--max-batches", "1",
              "--state-in", str(tmp_path / "state6.json")])  # fmt: skip
    with pytest.raises(ResumeStateError, match="saved for 3 curriculum stages, now one"):
        main([*common, "--stage", "code", "--max-batches", "1", "--state-in",
              str(tmp_path / "state7.json")])  # fmt: skip
    with pytest.raises(UsageError, match="curriculum stages never end"):
        main(["stream", "--config", str(path)])


def test_cli_elastic_across_layouts(base, tmp_path):
    """Two ranks (1 worker) save after 5 steps; one rank with 2 workers continues from both
    files: what the merged layout streams, counting steps from 5."""
    path = write_config(tmp_path / "stages.yaml", base)
    for rank in range(2):
        assert main(["stream", "--config", str(path), "--rank", str(rank), "--world-size", "2",
                     "--max-batches", "5", "--state-out", str(tmp_path / f"r{rank}.json")]) == 0  # fmt: skip
    rest, state = tmp_path / "rest.npz", tmp_path / "after.json"
    assert main(["stream", "--config", str(path), "--num-workers", "2", "--max-batches", "5",
                 "--state-in", str(tmp_path / "r0.json"), "--state-in", str(tmp_path / "r1.json"),
                 "--dump", str(rest), "--state-out", str(state)]) == 0  # fmt: skip
    setup = setup_of(base)
    _, states = old_layout(setup, 2, 1, 5)
    expected, _ = rank_batches(setup, 0, 1, 2, 5, resume=parse_saved(merge_states(states)))
    assert np.array_equal(np.load(rest)["input_ids"], np.stack([b["input_ids"] for b in expected]))
    assert json.loads(state.read_text())["batches"] == 10  # the rank's steps, from the start
    final = tmp_path / "final.npz"  # a file of an elastically resumed layout resumes exactly
    assert main(["stream", "--config", str(path), "--num-workers", "2", "--max-batches", "2",
                 "--state-in", str(state), "--dump", str(final)]) == 0  # fmt: skip
    more, _ = rank_batches(setup, 0, 1, 2, 7, resume=parse_saved(merge_states(states)))
    assert np.array_equal(np.load(final)["input_ids"], np.stack([b["input_ids"] for b in more[5:]]))


def test_damaged_staged_states_are_refused_in_one_line(base):
    setup = setup_of(base)
    _, (stream,) = rank_batches(setup, 0, 1, 1, 5)
    state = stream.state_dict()
    check_stream_state(state)
    for damage, message in (
        ({"stage": 7}, "field 'stage' is 7"),
        ({"stage": 2}, "stage 2's stream has yielded"),
        ({"batches": 4}, "field 'batches' is 4, but stage 1"),
        ({"mix": None}, "without its stream's state"),
        ({"first_step": 2}, "field 'batches' is 5, but stage 1"),
        ({"worker": 1}, "state belongs to"),
        ({"extra": 1}, "unknown field 'extra'"),
    ):
        with pytest.raises(ResumeStateError, match=message) as error:
            check_stream_state({**state, **damage})
            setup.stream(Placement(0, 1, 0, 1), epoch=0, resume={**state, **damage})
        assert "\n" not in str(error.value)
    with pytest.raises(ResumeStateError, match="it began at step 2 .*, this stream at step 0"):
        setup.stream(Placement(0, 1, 0, 1), epoch=0).reset({**state, "first_step": 2})
    # A damaged fingerprint: one line, with or without strict, and in merge_states.
    saved = WorkerState(0, Placement(0, 1, 0, 1), state, setup.fingerprint).to_dict()
    stages = setup.fingerprint["stages"]
    for damage in ({"stages": [stages[0], 5]}, {"stages": [{**stages[0], "start_step": "x"}]},
                   {"sources": [3]}, {"options": []}):  # fmt: skip
        damaged = {**saved, "fingerprint": {**setup.fingerprint, **damage}}
        for strict in (True, False):
            with pytest.raises(ResumeStateError, match="fingerprint is damaged"):
                setup.check_saved(damaged, strict=strict)
        if "stages" in damage:
            with pytest.raises(ResumeStateError, match="fingerprint is damaged"):
                merge_states([damaged])


def test_a_one_stage_run_resumes_a_curriculum_that_adds_stages(base):
    """A config of one stage streams a plain mix; adding stages after the step of its state is
    the documented edit: its mix state resumes stage 0 and the new stages follow on time."""
    one = {**base, "data_stages": base["data_stages"][:1]}
    curriculum = load_curriculum(one)
    mix = StreamSetup.mixed(curriculum.stage_spec(0), StreamOptions(**curriculum.options))
    _, streams = rank_batches(mix, 1, 2, 2, 3)  # steps 1..3: in stage 0 (until step 3)
    states = [WorkerState(0, Placement(1, 2, w, 2), s.state_dict(), mix.fingerprint).to_dict()
              for w, s in enumerate(streams)]  # fmt: skip
    setup = setup_of(base)
    saved = [setup.check_saved(json.loads(json.dumps(s))) for s in states]
    assert saved_position(*[s.stream for s in saved]) == {"stage": 0, "step": 3}
    resumed = [setup.stream(Placement(1, 2, w, 2), epoch=0, resume=saved[w].stream)
               for w in range(2)]  # fmt: skip
    got = [next(resumed[t % 2]) for t in range(3, 8)]  # worker 1 has step 4 (stage 'blend')
    assert_same(got, by_the_rule(setup, 1, 2, 2, 8)[3:])
    with pytest.raises(ResumeStateError, match=r"stage 1 \('blend'\) now starts at step 3"):
        setup_of(changed(base, 1, start=3)).check_saved(states[0])
    _, old = rank_batches(mix, 0, 1, 2, 2)
    merged = merge_states([WorkerState(0, Placement(0, 1, w, 2), s.state_dict(),
                                       mix.fingerprint).to_dict() for w, s in enumerate(old)])  # fmt: skip
    elastic = mix.stream(Placement(0, 1, 0, 1), epoch=0, num_batches=9, resume=parse_saved(merged))
    next(elastic)
    with pytest.raises(ResumeStateError, match="resumed elastically"):
        setup.stream(Placement(0, 1, 0, 1), epoch=0, resume=elastic.state_dict())
