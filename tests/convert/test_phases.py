"""The phases in Python: an output and work folder on an object store (SeaweedFS), the plan file
read as someone else's (tampered, newer, old-format plans refused in one line), and the
tokenizer and chat template travelling with the plan to workers that have no tokenizer files."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import shardtok
from shardtok.convert import RunOptions, convert, load_sft_config, load_tokenizer
from shardtok.convert.engines import ranks
from shardtok.convert.inputs.units import auto_unit_size
from shardtok.convert.job import phases, unit_status
from shardtok.convert.job.merge import UnitsNotReadyError
from shardtok.convert.job.plan_file import PlanError
from shardtok.convert.job.spec import distributed_unit_size
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH
from shardtok.errors import ShardtokError, UsageError
from tests.convert.test_determinism import s3_tree_digest, tree_digest, write_corpus
from tests.convert.test_determinism import small_options as options

ONE = RunOptions(workers=1, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder / "part-a.jsonl", 400, seed=7)
    write_corpus(folder / "part-b.jsonl", 200, seed=8)
    with open(folder / "part-b.jsonl", "a") as f:
        f.write('{"text": 5}\n')  # a reject, so that rejects.jsonl is compared too
    return folder


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(options(corpus, out, on_bad_record="skip"), ONE)
    return tree_digest(out)


def test_distributed_unit_size_is_the_local_default_below_160_gb():
    for total in (0, 1 << 20, 10 << 30, 100 * 10**9, 160 * 10**9):
        assert distributed_unit_size(total) == auto_unit_size(total)
    assert distributed_unit_size(10**12) == 10**8  # 1 TB: 10,000 units of 100 MB
    assert distributed_unit_size(10 * 10**12) == 256 << 20  # 10 TB: 37,253 units, not 596,047


def test_output_and_work_folder_on_an_object_store(corpus, reference, s3_server):
    storage = s3_server.storage_options()
    url = s3_server.url(f"phases-{uuid.uuid4().hex[:8]}/out")
    summary = phases.plan(
        options(corpus, url, on_bad_record="skip"), RunOptions(storage_options=storage)
    )
    assert summary.units > 4 and summary.units_done == 0
    first = ranks.run_units(url, 0, 2, storage_options=storage, progress=False)
    assert first.tokenized == len(range(0, summary.units, 2)) and not first.failed
    found = unit_status.status(url, storage)
    assert (found.exit_code, found.first_missing) == (3, 1)
    ranks.run_units(url, 1, 2, workers=2, storage_options=storage, progress=False)
    assert unit_status.status(url, storage).complete
    result = phases.merge(url, jobs=2, storage_options=storage, progress=False)
    assert result.documents == 600

    assert s3_tree_digest(url, storage) == reference  # and no work folder left
    assert unit_status.status(url, storage).merged


@pytest.fixture(scope="module")
def planned(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("planned") / "out"
    phases.plan(options(corpus, out))
    return out


def _tampered(planned: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "out"
    shutil.copytree(planned, out)
    plan = out / WORK_DIR_NAME / "plan.json"
    doc = json.loads(plan.read_text())
    plan.write_text(json.dumps(edit(doc) or doc))
    return out


def _set(path: list, value):
    def edit(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            _set(["version"], 3),
            "plan version 3 was written by a newer shardtok; this one reads version 2",
        ),  # fmt: skip
        (_set(["job", "shard_size"], -1), "job.shard_size must be >= 1, got -1"),
        (_set(["job", "shard_size"], True), "job.shard_size must be an integer, got true"),
        (_set(["job", "inputs", 0, "kind"], "exe"), "job.inputs[0].kind must be one of"),
        (_set(["job", "units", 0, 2, 0, 2], 10**12), "job.units[0] piece 0 end must be between"),
        (_set(["job", "units", 1, 0], 0), "job.units[1] index must be between 1 and 1"),
        (_set(["job", "tokenizer", "eos_id"], 10**6), "job.tokenizer.eos_id must be between"),
        (_set(["job", "text_key"], "body"), "the job disagrees with the plan's fingerprint"),
        (_set(["job", "name"], "../x"), "job.name must be a plain file name prefix"),
        (_set(["job", "sft"], "yes"), "job.sft must be a mapping"),
        (lambda doc: {"format": 1, "inputs": []}, "from an older shardtok"),
        (lambda doc: ["not", "a", "plan"], "not a shardtok convert plan"),
    ],
)
def test_a_tampered_plan_is_refused_in_one_line(planned, tmp_path, edit, message):
    out = _tampered(planned, tmp_path, edit)
    for call in (lambda: unit_status.status(str(out)), lambda: ranks.run_units(str(out), 0, 1)):
        with pytest.raises(PlanError) as error:
            call()
        text = str(error.value)
        assert message in text and "\n" not in text
        assert text.startswith(str(out / WORK_DIR_NAME / "plan.json"))
    assert not list((out / WORK_DIR_NAME).glob("unit-*")), "nothing was tokenized"


def test_tokenizer_json_must_be_the_planned_one(planned, tmp_path):
    out = _tampered(planned, tmp_path, lambda doc: None)
    tokenizer = out / WORK_DIR_NAME / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace("<|endoftext|>", "<|end|>", 1))
    with pytest.raises(PlanError, match="is not the tokenizer the plan was made with"):
        ranks.run_units(str(out), 0, 1)
    tokenizer.unlink()
    with pytest.raises(PlanError, match="tokenizer.json is missing"):
        unit_status.status(str(out))
    (out / WORK_DIR_NAME / "plan.json").write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        phases.merge(str(out))
    shutil.rmtree(out / WORK_DIR_NAME)
    with pytest.raises(UsageError, match="no plan in .*: run `shardtok convert plan"):
        ranks.run_units(str(out), 0, 1)


def test_rank_and_world_size_are_checked(planned):
    for rank, world in ((1, 1), (-1, 2), (0, 0), (True, 2)):
        with pytest.raises(UsageError):
            ranks.run_units(str(planned), rank, world)


RUN_UNITS = textwrap.dedent(
    """
    import sys
    from shardtok.convert.engines.ranks import run_units
    summary = run_units(sys.argv[1], 0, 1, progress=False)
    assert not summary.failed and summary.tokenized == summary.units, summary
    """
)


def _run_units_elsewhere(out: Path, cwd: Path) -> None:
    """run-units in a fresh process (no tokenizer built in memory), from another folder."""
    package_root = str(Path(shardtok.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": package_root}  # this checkout, wherever the cwd is
    result = subprocess.run(
        [sys.executable, "-c", RUN_UNITS, str(out)], capture_output=True, text=True, cwd=cwd,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_tokenizer_travels_with_the_plan(corpus, tmp_path, monkeypatch):
    tok = tmp_path / "my-tokenizer"
    shutil.copytree(BUNDLED_PATH, tok)
    # A relative input path (as given, it names the input in the manifest), read by run-units
    # from another working directory.
    monkeypatch.chdir(tmp_path.parent)
    job = options(corpus.relative_to(tmp_path.parent), tmp_path / "out", on_bad_record="skip")
    job = dataclasses.replace(job, tokenizer=load_tokenizer(str(tok)))
    convert(dataclasses.replace(job, output=str(tmp_path / "ref")), ONE)
    phases.plan(job)
    shutil.rmtree(tok)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run_units_elsewhere(tmp_path / "out", elsewhere)
    result = phases.merge(str(tmp_path / "out"), progress=False)
    assert result.manifest.tokenizer["name"] == "my-tokenizer"
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_the_chat_template_travels_with_the_plan(tmp_path):
    """--sft with the tokenizer's own chat template: workers rebuild the renderer from the
    template text in the plan, with the tokenizer folder gone."""
    from shardtok.convert.inputs.sample_corpus import write_sample_corpus
    from shardtok.convert.sft.setup import prepare_sft

    tok = tmp_path / "chat-tokenizer"
    shutil.copytree(BUNDLED_PATH, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["chat_template"] = (BUNDLED_PATH.parent / "chat_templates" / "alpaca.jinja").read_text()
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    chats = tmp_path / "chats.jsonl"
    write_sample_corpus(chats, 120_000, chat=True)
    yaml = tmp_path / "sft.yaml"
    yaml.write_text("format: openai\ntemplate: tokenizer\nmax_tokens: 4096\ntruncation: turns\n")
    spec = load_tokenizer(str(tok), append_eos=False)
    sft = prepare_sft(load_sft_config(yaml, {}), spec, tok)
    job = options(chats, tmp_path / "out", tokenizer=spec, sft=sft, on_bad_record="skip")
    convert(dataclasses.replace(job, output=str(tmp_path / "ref")), ONE)
    summary = phases.plan(job)
    assert summary.units > 2
    shutil.rmtree(tok)
    yaml.unlink()
    _run_units_elsewhere(tmp_path / "out", tmp_path)
    result = phases.merge(str(tmp_path / "out"), jobs=2, progress=False)
    assert result.sft is not None and result.sft["trained_tokens"] > 0
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_a_work_folder_of_the_old_format_starts_over(corpus, reference, tmp_path, caplog):
    """shardtok 0.2's plan.json was the fingerprint alone: its work is discarded, with the note
    the one-command convert has always given, and the plan is written in the new format."""
    out = tmp_path / "out"
    work = out / WORK_DIR_NAME
    work.mkdir(parents=True)
    (work / "plan.json").write_text(json.dumps({"format": 1, "inputs": [], "unit_size": 1}))
    (work / "unit-000000.json").write_text("{}")
    result = convert(
        options(corpus, out, on_bad_record="skip"), dataclasses.replace(ONE, keep_work=True)
    )
    assert "held unfinished work of other inputs or options; starting over" in caplog.text
    assert result.units_reused == 0
    doc = json.loads((work / "plan.json").read_text())
    assert (doc["format"], doc["version"]) == ("shardtok.convert-plan", 2)
    shutil.rmtree(work)
    assert tree_digest(out) == reference


# -- markers are someone else's files too ----------------------------------------------------


def _run_out(planned: Path, tmp_path: Path, edit=lambda doc: None) -> tuple[Path, Path, str]:
    """A copy of the planned output (its plan changed by `edit`) with every unit run: (output,
    work folder, the failure status names: the corpus's bad record, with its file and line)."""
    out = _tampered(planned, tmp_path, edit)
    assert ranks.run_units(str(out), 0, 1, progress=False).failed
    found = unit_status.status(str(out))
    assert found.exit_code == 1 and "part-b.jsonl" in found.failure
    return out, out / WORK_DIR_NAME, found.failure


@pytest.mark.parametrize("damage", ["{", '{"format": 3, "index": 1}', '"a string"'])
def test_a_damaged_done_marker_is_one_line_then_redone(planned, tmp_path, damage):
    out, work, failure = _run_out(planned, tmp_path)
    (work / "unit-000001.json").write_text(damage)
    with pytest.raises(ShardtokError) as error:  # was: JSONDecodeError, TypeError...
        unit_status.status(str(out))
    text = str(error.value)
    assert text.startswith(f"work unit {work / 'unit-000001.json'} is damaged") and "\n" not in text
    assert "run `shardtok convert run-units` again" in text
    assert ranks.run_units(str(out), 0, 1, progress=False).tokenized == 1
    assert unit_status.status(str(out)).failure == failure


def test_a_failure_marker_naming_a_piece_outside_its_unit_is_redone(planned, tmp_path):
    out, work, failure = _run_out(planned, tmp_path)
    (marker,) = work.glob("unit-*.failed.json")
    doc = json.loads(marker.read_text())
    marker.write_text(json.dumps(dict(doc, piece=99)))
    found = unit_status.status(str(out))  # was: IndexError, in status, run-units and merge
    assert found.exit_code == 3 and found.first_missing == doc["index"]
    with pytest.raises(UnitsNotReadyError):
        phases.merge(str(out), progress=False)
    summary = ranks.run_units(str(out), 0, 1, progress=False)
    assert summary.failed == (doc["index"],) and summary.failure == failure
    assert json.loads(marker.read_text()) == doc


def test_merge_and_status_agree_on_a_mismatch_the_job_no_longer_has(planned, tmp_path):
    """A tiktoken mismatch recorded before the plan switched to the tokenizers backend (the
    same units): status counts the unit as to do, and the merge says so too, instead of
    raising the mismatch and advising the backend already in use."""
    # The bundled tokenizer qualifies for tiktoken: the plan is switched to tokenizers.
    out, work, _ = _run_out(planned, tmp_path, _set(["job", "tokenizer", "backend"], "hf"))
    (work / "unit-000000.json").unlink()
    mismatch = {
        "format": "shardtok.unit-failure", "version": 1, "kind": "encoder_mismatch",
        "index": 0, "piece": 0, "record": 3, "detail": "ids differ", "stop_at_bad_record": True,
    }  # fmt: skip
    (work / "unit-000000.failed.json").write_text(json.dumps(mismatch))
    found = unit_status.status(str(out))
    assert (found.missing, found.first_missing) == (1, 0)  # (and the bad record still fails)
    with pytest.raises(UnitsNotReadyError, match="unit-000000.json is not finished"):
        phases.merge(str(out), progress=False)
