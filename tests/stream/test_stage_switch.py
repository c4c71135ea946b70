"""What a curriculum stage switch does to the sources (``stage_switch``), and per-stage batch
sizes. Every token id is unique within its source (tests/helpers/stages.py), so a token seen
twice is a document served twice."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.options import StreamOptions
from shardtok.stream.preview import format_preview, mix_preview
from shardtok.stream.resume.fingerprint import check_fingerprint
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, WorkerState, parse_saved, saved_position
from shardtok.testing.save_restore import check_save_restore
from tests.helpers.stages import BASES, OPTIONS, write_sources

SWITCH = 11  # the run: {A: 1.0}, then {A: 0.5, B: 0.5} from step 11


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("switch"))


def two_stages(paths, switch="continue", packing="concat", **more) -> dict:
    return {
        **OPTIONS, "packing": packing, "stage_switch": switch, **more,
        "data_stages": [
            {"name": "a", "data": {"dataset": {"dataset_path": paths[0]}}},
            {"name": "a+b", "start_training_step": SWITCH,
             "data": {"dataset": {"dataset_path": {paths[0]: 0.5, paths[1]: 0.5}}}},
        ],
    }  # fmt: skip


def setup_of(config: dict) -> StreamSetup:
    curriculum = load_curriculum(config)
    return StreamSetup.staged(curriculum, StreamOptions(**curriculum.options))


def rank_batches(setup, steps, *, rank=0, world=1, workers=1, resume=None):
    streams = [
        setup.stream(Placement(rank, world, w, workers), epoch=0,
                     resume=resume[w] if isinstance(resume, list) else resume)
        for w in range(workers)
    ]  # fmt: skip
    return [next(streams[t % workers]) for t in range(steps)], streams


def tokens_of(batches, source: int) -> np.ndarray:
    """Every token of `source` the batches trained on, inputs and the last target of each row
    (concat windows do not overlap: each token is in one row; greedy rows hold whole
    documents, padding is id 0, which only source 0 could own and is dropped)."""
    out = []
    for batch in batches:
        rows = np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)
        for row, owner in zip(rows, batch["source_ids"]):
            if owner == source:
                out.append(row[row > BASES[source]] if source == 0 else row)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_a_switch_continues_the_source_and_restart_repeats_it(paths, packing):
    """The issue's run: continue serves no A token twice; restart (Nanotron's rule) serves the
    documents stage 'a' read again from the start."""
    continued, _ = rank_batches(setup_of(two_stages(paths, packing=packing)), 30)
    a = tokens_of(continued, 0)
    assert len(a) > 400 and len(np.unique(a)) == len(a)
    assert set(np.unique(tokens_of(continued, 1))) and set(continued[-1]["source_ids"]) <= {0, 1}
    restarted, _ = rank_batches(setup_of(two_stages(paths, "restart", packing)), 30)
    a = tokens_of(restarted, 0)
    assert len(np.unique(a)) < len(a) - 100  # stage 'a+b' read stage 'a's documents again
    # the first stage is the same under both rules: what a plain mix of A draws
    for x, y in zip(continued[: SWITCH - 1], restarted[: SWITCH - 1]):
        assert np.array_equal(x["input_ids"], y["input_ids"])


def test_continuing_stages_resume_exactly_across_the_switch(paths):
    """k + resume + (N - k) equals N, for a state in stage 'a', at the switch and after it
    (its parked and current sources), worker 1 of 2."""
    setup = setup_of(two_stages(paths, packing="greedy"))
    check_save_restore(
        lambda: setup.stream(Placement(0, 1, 1, 2), epoch=0, num_batches=10),
        midpoints=(0, 3, 4, 5, 7, -1),
        max_state_bytes=16384,
    )


def test_a_parked_source_continues_in_a_later_stage(paths):
    """A source left out of a stage keeps its position: A, then B alone, then A again serves A's
    documents once, across a save in the middle stage (A parked in the state)."""
    config = {
        **OPTIONS, "packing": "concat",
        "data_stages": [
            {"name": "a", "data": {"dataset": {"dataset_path": paths[0]}}},
            {"name": "b", "start_training_step": 5, "data": {"dataset": {"dataset_path": paths[1]}}},
            {"name": "a again", "start_training_step": 9,
             "data": {"dataset": {"dataset_path": paths[0]}}},
        ],
    }  # fmt: skip
    setup = setup_of(config)
    whole, _ = rank_batches(setup, 14)
    a = tokens_of(whole, 0)
    assert len(a) == 10 * 2 * 16 and len(np.unique(a)) == len(a)  # steps 1-4 and 9-14
    first, streams = rank_batches(setup, 6)
    state = streams[0].state_dict()
    assert state["sources"][0] is not None and state["sources"][1] is None  # A parked, B in mix
    rest, _ = rank_batches(setup, 8, resume=state)
    for x, y in zip(first + rest, whole):
        assert np.array_equal(x["input_ids"], y["input_ids"])


def test_a_stage_may_set_its_own_batch_size(paths):
    """A batch-size ramp-up: stage 'a+b' trains on batches of 4, and resumes exactly across."""
    config = two_stages(paths)
    config["data_stages"][1]["data"]["batch_size"] = 4
    setup = setup_of(config)
    batches, _ = rank_batches(setup, 14)
    assert [len(b["input_ids"]) for b in batches] == [2] * (SWITCH - 1) + [4] * 4
    a = tokens_of(batches, 0)
    assert len(np.unique(a)) == len(a)
    check_save_restore(
        lambda: setup.stream(Placement(0, 1, 0, 1), epoch=0, num_batches=14),
        midpoints=(0, 9, 10, 11, -1),
        max_state_bytes=16384,
    )
    preview = mix_preview(setup.curriculum, setup.options, max_batches=14)
    assert [s["batch_size"] for s in preview["stages"]] == [2, 4]
    assert [sum(r["sequences_per_rank"] for r in s["sources"]) for s in preview["stages"]] == [
        20,
        16,
    ]
    assert "batches per rank of 4" in format_preview(preview)
    # a resume may change a stage's batch size: the same rows, in batches of the new size
    other = two_stages(paths)
    other["data_stages"][1]["data"]["batch_size"] = 8
    assert check_fingerprint(setup.fingerprint, setup_of(other).fingerprint) == []
    _, streams = rank_batches(setup, 12)
    resumed, _ = rank_batches(setup_of(other), 2, resume=streams[0].state_dict())
    rows = np.concatenate([b["input_ids"] for b in resumed])
    assert np.array_equal(rows[:8], np.concatenate([b["input_ids"] for b in batches[12:]]))
    assert [len(b["input_ids"]) for b in resumed] == [8, 8]


def test_the_rule_is_part_of_the_fingerprint_and_stage_seeds_must_agree(paths):
    restart = setup_of(two_stages(paths, "restart")).fingerprint
    now = setup_of(two_stages(paths)).fingerprint
    with pytest.raises(ResumeStateError, match="stage_switch 'restart' saved, 'continue' now"):
        check_fingerprint(restart, now, stage=1, step=SWITCH)
    # a 0.3.0 state of stages (no stage_switch recorded) restarted its sources
    old = {k: v for k, v in restart.items() if k != "stage_switch"}
    assert check_fingerprint(old, restart, stage=1, step=SWITCH) == []
    seeded = two_stages(paths)
    seeded["data_stages"][1]["data"]["seed"] = 77
    with pytest.raises(UsageError, match="stage 'a' has seed 3, stage 'a\\+b' 77"):
        setup_of(seeded)
    # a state of one rule is refused by the other's stream, even when the fingerprint is not
    _, streams = rank_batches(setup_of(two_stages(paths)), 12)
    with pytest.raises(ResumeStateError, match="stage_switch: continue resumes it"):
        setup_of(two_stages(paths, "restart")).stream(
            Placement(0, 1, 0, 1), epoch=0, resume=streams[0].state_dict()
        )


def test_preview_counts_what_continuing_sources_served_before(paths):
    """A in steps 1-4 and again from step 9: the preview of the last stage counts A's 20 rows
    so far under continue, its own 12 under restart (and notes the re-read)."""
    stages = [
        {"name": "a", "data": {"dataset": {"dataset_path": paths[0]}}},
        {"name": "b", "start_training_step": 5, "data": {"dataset": {"dataset_path": paths[1]}}},
        {"name": "a again", "start_training_step": 9,
         "data": {"dataset": {"dataset_path": paths[0]}}},
    ]  # fmt: skip
    epochs = {}
    for switch in ("continue", "restart"):
        setup = setup_of({**OPTIONS, "stage_switch": switch, "data_stages": stages})
        preview = mix_preview(setup.curriculum, setup.options, max_batches=14)
        (row,) = preview["stages"][2]["sources"]
        assert row["sequences_per_rank"] == 12
        epochs[switch] = row["epochs"]
        assert bool(preview["notes"]) == (switch == "restart")
        assert f"stage_switch: {switch}" in format_preview(preview)
    per_epoch = setup.plan(epoch=0, world_size=1, num_workers=1).slice_for(0, 0).num_sequences
    assert epochs == pytest.approx({"continue": 20 / per_epoch, "restart": 12 / per_epoch})


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_elastic_resume_of_continuing_stages_serves_no_token_twice(paths, packing):
    """2 ranks x 1 worker save inside stage 'a+b'; 1 rank x 2 workers continue: every source
    (A from both stages, B) finishes the old layout's epochs without a token twice."""
    setup = setup_of(two_stages(paths, packing=packing))
    before, states = [], []
    for rank in range(2):
        batches, streams = rank_batches(setup, 13, rank=rank, world=2)
        before += batches
        state = WorkerState(0, Placement(rank, 2, 0, 1), streams[0].state_dict(),
                            setup.fingerprint).to_dict()  # fmt: skip
        states.append(state)
    merged = parse_saved(merge_states(states))
    assert (merged.stage, merged.step) == (1, 13)
    check_fingerprint(merged.fingerprint, setup.fingerprint, **saved_position(merged))
    after, _ = rank_batches(setup, 20, workers=2, resume=merged)
    for source in (0, 1):
        seen = np.concatenate([tokens_of(before, source), tokens_of(after, source)])
        assert len(np.unique(seen)) == len(seen), f"source {source}: a token twice"


def test_the_cli_counts_a_ramped_stages_rows(paths, tmp_path, capsys):
    """`shardtok stream` counts each batch's own rows: a stage of batches of 4 after batches of
    2 fills exactly its slots with concat packing."""
    import json

    from shardtok.cli.main import main
    from tests.helpers.stages import write_config

    config = two_stages(paths)
    config["data_stages"][1]["data"]["batch_size"] = 4
    path = write_config(tmp_path / "ramp.yaml", config)
    assert main(["stream", "--config", str(path), "--max-batches", "14", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["input_tokens"] == ((SWITCH - 1) * 2 + 4 * 4) * OPTIONS["seq_len"]
    assert stats["packing_efficiency"] == 1.0
