"""A sequence-length curriculum: a stage with its own ``seq_len``. A continuing source packs the
rest of the phase it was in with the new window, then its next epoch; no token comes twice and
none is skipped before its source's epoch ends. Token ids are unique within each source
(tests/helpers/stages.py), so a token seen twice is a document served twice."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.stream.build import document_stream, plan_for
from shardtok.stream.mix.source import SourceSequences
from shardtok.stream.options import StreamOptions
from shardtok.stream.preview import format_preview, mix_preview
from shardtok.stream.resume.fingerprint import check_fingerprint
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, WorkerState, parse_saved
from shardtok.testing.save_restore import check_save_restore
from tests.helpers.stages import OPTIONS, write_sources
from tests.stream.test_stage_switch import rank_batches, setup_of, tokens_of

LONG, SHORT = 11, 21  # the steps the 31-token and the 7-token stages start at


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("seq_len"))


def resized(paths, packing="concat", switch="continue") -> dict:
    """A alone in 15-token rows, then A and B in 31-token rows, then in 7-token rows."""
    both = {"dataset_path": {paths[0]: 0.5, paths[1]: 0.5}}
    return {
        **OPTIONS, "packing": packing, "stage_switch": switch,
        "data_stages": [
            {"name": "short", "data": {"dataset": {"dataset_path": paths[0]}}},
            {"name": "long", "start_training_step": LONG, "data": {"dataset": both, "seq_len": 31}},
            {"name": "shorter", "start_training_step": SHORT,
             "data": {"dataset": both, "seq_len": 7}},
        ],
    }  # fmt: skip


@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
def test_each_stage_packs_its_own_length_and_resumes_exactly(paths, packing):
    setup = setup_of(resized(paths, packing))
    batches, _ = rank_batches(setup, 30)
    widths = [b["input_ids"].shape[1] for b in batches]
    assert widths == [15] * (LONG - 1) + [31] * (SHORT - LONG) + [7] * (31 - SHORT)
    a = tokens_of(batches, 0)
    assert len(a) > 600 and len(np.unique(a)) == len(a)  # A carried on through both switches
    # k + resume + (N - k): states before, at and after each switch (inside a repacked rest)
    check_save_restore(
        lambda: setup.stream(Placement(0, 1, 1, 2), epoch=0, num_batches=15),
        midpoints=(0, 4, 5, 6, 9, 10, 11, -1),
        max_state_bytes=32768,
    )


def epoch_tokens(source: DatasetSource, options: StreamOptions) -> np.ndarray:
    """Every token of the only slice of epoch 0, in the order its documents come."""
    plan = plan_for(source, options, epoch=0, world_size=1, num_workers=1)
    documents = document_stream(source, plan.slice_for(0, 0), options, 0)
    documents.reset(None)
    return np.concatenate(list(documents))


@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
def test_the_rest_of_an_epoch_is_packed_once_in_each_new_window(paths, packing):
    """A source moved 15 -> 31 -> 7 tokens per row serves its epoch 0 exactly: concat the
    epoch's tokens in order, but for a tail shorter than a row; greedy and bfd every token once."""
    source = DatasetSource(paths[0])
    base = StreamOptions(**{**OPTIONS, "packing": packing, "overlong": "split"}).resolve([False])
    served, state = [], None
    for seq_len, rows in ((15, 40), (31, 30), (7, None)):
        stream = SourceSequences(
            source, StreamOptions(**{**base.to_dict(), "seq_len": seq_len}),
            rank=0, world_size=1, worker=0, num_workers=1,
        )  # fmt: skip
        if state is not None:
            stream.continue_from(state)  # what a stage switch does with a source's position
        for _ in range(rows or 10**6):
            out = np.zeros(seq_len + 1, dtype=np.int64)
            _, length = stream.next_into(out)
            if stream.epoch == 1 and not stream.in_remainder:
                break  # that row opened epoch 1
            served.append(out[:length])
        state = stream.state_dict()
        if rows is not None:
            assert state["remainder"] is (seq_len != 15)
    tokens = np.concatenate(served)
    everything = epoch_tokens(source, base)
    if packing == "concat":
        assert np.array_equal(tokens, everything[: len(tokens)])
        assert len(everything) - len(tokens) < 8  # the tail: less than one 7-token row
    else:
        assert np.array_equal(np.sort(tokens), np.sort(everything))


def test_restarting_stages_pack_their_own_length_from_the_start(paths):
    batches, _ = rank_batches(setup_of(resized(paths, switch="restart")), 25)
    widths = [b["input_ids"].shape[1] for b in batches]
    assert widths == [15] * (LONG - 1) + [31] * (SHORT - LONG) + [7] * (26 - SHORT)


def test_the_fingerprint_compares_the_lengths_of_the_stages_reached(paths):
    saved = setup_of(resized(paths)).fingerprint
    assert [s.get("seq_len") for s in saved["stages"]] == [None, 31, 7]
    later = resized(paths)
    later["data_stages"][2]["data"]["seq_len"] = 9  # a stage the state has not reached
    assert check_fingerprint(saved, setup_of(later).fingerprint, stage=1, step=LONG) == []
    reached = resized(paths)
    reached["data_stages"][1]["data"]["seq_len"] = 63
    with pytest.raises(ResumeStateError, match=r"stage 1 \('long'\): seq_len 31 saved, 63 now"):
        check_fingerprint(saved, setup_of(reached).fingerprint, stage=1, step=LONG)
    # the shared length, where a stage has none of its own, compares as before
    shared = resized(paths)
    shared["seq_len"] = 23
    with pytest.raises(ResumeStateError, match="seq_len"):
        check_fingerprint(saved, setup_of(shared).fingerprint, stage=0, step=3)
    # a state saved without per-stage lengths: its stages had the shared one
    old = {
        **saved,
        "stages": [{k: v for k, v in s.items() if k != "seq_len"} for s in saved["stages"]],
    }
    with pytest.raises(ResumeStateError, match=r"stage 1 \('long'\): seq_len 15 saved, 31 now"):
        check_fingerprint(old, saved, stage=1, step=LONG)


def test_the_preview_counts_each_stage_in_its_own_rows(paths):
    setup = setup_of(resized(paths))
    preview = mix_preview(setup.curriculum, setup.options, max_batches=25)
    assert [s["seq_len"] for s in preview["stages"]] == [15, 31, 7]
    assert "batches per rank of 2 x 31" in format_preview(preview)
    long_a = preview["stages"][1]["sources"][0]
    assert long_a["tokens_per_rank"] == long_a["sequences_per_rank"] * 31
    # concat is exact: what A leaves unread of its epoch is what the stream did not serve
    batches, _ = rank_batches(setup, 25)
    read = len(tokens_of(batches, 0))
    (row,) = [r for r in preview["stages"][2]["sources"] if r["id"] == 0]
    total = setup.plan(epoch=0, world_size=1, num_workers=1).slice_for(0, 0).num_tokens
    assert row["last_epoch"] == 0 and row["unread_tokens"] == total - read


def test_a_parked_source_in_another_window_merges_with_it(paths):
    """A in 15-token rows, then B alone in 31-token rows, then A again in 31: 2 ranks save in
    B's stage (A parked at 15 tokens), 1 rank x 2 workers continue; A comes once."""
    config = {
        **OPTIONS, "packing": "concat",
        "data_stages": [
            {"name": "a", "data": {"dataset": {"dataset_path": paths[0]}}},
            {"name": "b", "start_training_step": 5,
             "data": {"dataset": {"dataset_path": paths[1]}, "seq_len": 31}},
            {"name": "a again", "start_training_step": 9,
             "data": {"dataset": {"dataset_path": paths[0]}, "seq_len": 31}},
        ],
    }  # fmt: skip
    setup = setup_of(config)
    before, states = [], []
    for rank in range(2):
        batches, streams = rank_batches(setup, 6, rank=rank, world=2)
        before += batches
        states.append(WorkerState(0, Placement(rank, 2, 0, 1), streams[0].state_dict(),
                                  setup.fingerprint).to_dict())  # fmt: skip
    merged = parse_saved(merge_states(states))
    windows = {s.get("window", {}).get("seq_len") for s in merged.layout["sources"][0]}
    assert windows == {15}  # A's old slices were packed in 15-token rows
    after, _ = rank_batches(setup, 8, workers=2, resume=merged)
    assert {b["input_ids"].shape[1] for b in after} == {31}
    seen = np.concatenate([tokens_of(before, 0), tokens_of(after, 0)])
    assert len(seen) > len(tokens_of(before, 0)) and len(np.unique(seen)) == len(seen)


def test_a_source_inside_a_repacked_rest_is_not_merged_again(paths):
    setup = setup_of(resized(paths))
    states = []
    for rank in range(2):
        _, streams = rank_batches(setup, LONG + 1, rank=rank, world=2)
        states.append(WorkerState(0, Placement(rank, 2, 0, 1), streams[0].state_dict(),
                                  setup.fingerprint).to_dict())  # fmt: skip
    with pytest.raises(ResumeStateError, match="source 0 is still finishing"):
        merge_states(states)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("window", {"seq_len": 0, "stride": None}, "window"),
        ("window", {"seq_len": 31}, "a window must be"),
        ("window", {"seq_len": 15, "stride": None}, "only a stage switch changes them"),
        ("repack", {"base": "epoch", "windows": []}, "field 'repack' must be"),
        ("repack", {"base": "elsewhere", "windows": [{}]}, "field 'repack' must be"),
        ("remainder", False, "field 'repack' needs 'remainder' true"),
    ],
)
def test_a_damaged_window_or_repack_is_one_line(paths, field, value, message):
    setup = setup_of(resized(paths))
    _, streams = rank_batches(setup, LONG + 1)
    state = streams[0].state_dict()
    source = state["mix"]["batcher"]["upstream"]["sources"][0]
    assert source["repack"]["base"] == "epoch"  # A is packing its epoch's rest in 31-token rows
    source[field] = value
    with pytest.raises(ResumeStateError, match=message) as refused:
        next(setup.stream(Placement(0, 1, 0, 1), epoch=0, resume=state))
    assert "\n" not in str(refused.value)


def test_the_cli_streams_and_previews_a_length_curriculum(paths, tmp_path, capsys):
    import json

    from shardtok.cli.main import main
    from tests.helpers.stages import write_config

    path = write_config(tmp_path / "lengths.yaml", resized(paths))
    assert main(["stream", "--config", str(path), "--max-batches", "25", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["input_tokens"] == 2 * (15 * (LONG - 1) + 31 * (SHORT - LONG) + 7 * 5)
    assert stats["packing_efficiency"] == 1.0  # concat fills every row of every length
    assert main(["stream", "--config", str(path), "--max-batches", "25", "--plan"]) == 0
    assert "batches per rank of 2 x 7" in capsys.readouterr().out


def test_a_parked_position_in_a_window_no_stage_read_it_in_is_refused(paths):
    config = resized(paths)
    config["data_stages"][1]["data"]["dataset"] = {"dataset_path": paths[1]}  # A parked
    setup = setup_of(config)
    _, streams = rank_batches(setup, LONG + 1)
    state = streams[0].state_dict()
    assert state["sources"][0]["window"]["seq_len"] == 15
    next(setup.stream(Placement(0, 1, 0, 1), epoch=0, resume=state))
    for window in ({"seq_len": 31, "stride": None}, None):
        state["sources"][0]["window"] = window
        if window is None:
            del state["sources"][0]["window"]
        with pytest.raises(ResumeStateError, match="parked source 0 must record the window"):
            next(setup.stream(Placement(0, 1, 0, 1), epoch=0, resume=state))


@pytest.mark.parametrize("workers", [2, 3])
def test_the_preview_is_exact_with_workers_and_a_one_step_stage(paths, workers):
    """With several workers, A's slices switch length at different local batches, and in a
    stage of one step only worker 0 has a batch: the preview's unread tokens of A are still
    exactly what the workers did not serve (concat)."""
    config = resized(paths)
    config["data_stages"][2]["start_training_step"] = LONG + 1
    setup = setup_of(config)
    batches, _ = rank_batches(setup, 25, workers=workers)
    read = sum(
        row.size + 1  # inputs and the last target: concat rows do not overlap
        for b in batches
        for row, owner in zip(b["input_ids"], b["source_ids"])
        if owner == 0
    )
    preview = mix_preview(setup.curriculum, setup.options, max_batches=25, num_workers=workers)
    (row,) = [r for r in preview["stages"][2]["sources"] if r["id"] == 0]
    plan = setup.plan(epoch=0, world_size=1, num_workers=workers)
    total = sum(s.num_tokens for s in plan.slices)
    assert row["last_epoch"] == 0 and row["unread_tokens"] == total - read
