"""The job spec: one ConvertJob, JSON and back, stored in the plan and read by every engine."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shardtok.cli.main import main
from shardtok.convert import ConvertJob, RunOptions, load_sft_config, load_tokenizer, prepare_sft
from shardtok.convert.job import phases
from shardtok.convert.job.plan_file import PlanError, job_from_json, load_plan
from shardtok.convert.job.workdir import WorkDir
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH
from shardtok.errors import UsageError


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled")


@pytest.fixture(scope="module")
def sft_spec():
    return load_tokenizer("bundled", append_eos=False, backend="hf")


def _sft(sft_spec, **overrides):
    config = load_sft_config(None, {"format": "openai", "template": "alpaca", **overrides})
    return prepare_sft(config, sft_spec, BUNDLED_PATH)


def _jobs(spec, sft_spec):
    plain = ConvertJob(("a.jsonl", "b/"), "out", spec)
    return [
        plain,
        dataclasses.replace(
            plain,
            text_key="meta.text",
            txt_mode="lines",
            on_bad_record="skip",
            shard_size=1 << 20,
            compression_level=None,
            frame_size=4096,
            unit_size=1 << 16,
            name="web",
        ),  # fmt: skip
        ConvertJob(("chat.jsonl",), "sft", sft_spec, sft=_sft(sft_spec, max_tokens=512)),
    ]


def test_a_job_is_json_and_back(spec, sft_spec):
    for job in _jobs(spec, sft_spec):
        doc = json.loads(json.dumps(job.to_json()))  # JSON types only
        again = job_from_json(doc, job.tokenizer.backend_json.encode(), "job.json")
        assert again.to_json() == doc
        assert dataclasses.replace(again, tokenizer=job.tokenizer, sft=job.sft) == job
        assert again.tokenizer.fingerprint == job.tokenizer.fingerprint
        if job.sft is not None:
            assert again.sft.metadata == job.sft.metadata
            assert again.sft.renderer.source == job.sft.renderer.source


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda d: d.update(shard_size="big"), "job.shard_size"),
        (lambda d: d.update(on_bad_record="ignore"), "job.on_bad_record"),
        (lambda d: d.update(inputs=[]), "job.inputs"),
        (lambda d: d.update(name="../up"), "job.name"),
        (lambda d: d["tokenizer"].update(fingerprint="sha256:00"), "tokenizer.json"),
        (lambda d: d.pop("output"), "job.output"),
    ],
)
def test_an_edited_job_is_refused_in_one_line_naming_the_field(spec, edit, named):
    doc = ConvertJob(("a.jsonl",), "out", spec).to_json()
    edit(doc)
    with pytest.raises(PlanError) as caught:
        job_from_json(doc, spec.backend_json.encode(), "job.json")
    message = str(caught.value)
    assert message.startswith("job.json") and named in message and "\n" not in message


def test_the_plan_stores_the_job_that_every_phase_reads(spec, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50)))
    job = ConvertJob((str(corpus),), str(tmp_path / "out"), spec, shard_size=4096, name="x")
    phases.plan(job, RunOptions(progress=False))
    stored = json.loads((tmp_path / "out" / ".shardtok-work" / "plan.json").read_text())["job"]
    plan = load_plan(WorkDir(str(tmp_path / "out")))
    # The plan's job is the spec, its inputs the files found and its unit size chosen.
    assert plan.job == dataclasses.replace(job, unit_size=plan.unit_size)
    for key, value in job.to_json().items():
        if key not in ("inputs", "unit_size"):
            assert stored[key] == value, key


def test_fine_tuning_flags_need_no_yaml(tmp_path):
    chat = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(40)
    ]
    chat.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sft.yaml").write_text("format: openai\ntemplate: alpaca\nmax_tokens: 64\n")
    flags = ["--sft-format", "openai", "--chat-template", "alpaca", "--max-tokens", "64"]
    yaml = ["--sft", str(tmp_path / "sft.yaml")]
    for name, how in (("flags", flags), ("yaml", yaml)):
        assert main(["convert", str(chat), "-o", str(tmp_path / name), "-q", *how]) == 0
    for file in ("index.json", "shard-000000.tar"):
        assert (tmp_path / "flags" / file).read_bytes() == (tmp_path / "yaml" / file).read_bytes()


def test_fine_tuning_flags_without_a_format_say_what_is_missing():
    with pytest.raises(UsageError, match=r"^--chat-template needs the records' format: add "):
        load_sft_config(None, {"template": "alpaca"})
    with pytest.raises(UsageError, match=r"jq needs 'message_construction' \(in an --sft"):
        load_sft_config(None, {"format": "jq"})
