"""`shardtok convert --sft`: each format end to end, bad records, the refusals, resume, and the
same bytes for any worker count and start method."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardtok.cli.main import main
from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.setup import prepare_sft
from shardtok.errors import BadRecordError, UsageError
from tests.helpers.sft_data import (
    NOTE_YAML,
    VICUNA,
    dataset_bytes,
    decode,
    documents,
    special_tokenizer,
    trained_runs,
    write_jsonl,
)

CHAT = {
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Hi there"},
        {"from": "gpt", "value": "Hello! How are you?"},
        {"from": "human", "value": "Fine."},
        {"from": "gpt", "value": "Good to hear."},
    ]
}
SHAREGPT = "format: sharegpt\ntemplate: chatml\n"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    return special_tokenizer(tmp_path_factory.mktemp("tok") / "special")


@pytest.fixture(scope="module")
def spec(tok):
    return load_tokenizer(str(tok), append_eos=False, backend="hf")


def setup_for(tmp_path, spec, tok, yaml_text: str, **overrides):
    path = tmp_path / "sft.yaml"
    path.write_text(yaml_text)
    return prepare_sft(load_sft_config(path, overrides), spec, tok)


def run(tmp_path, spec, tok, yaml_text, inputs, out="out", overrides=None, run=None, **fields):
    """Convert `inputs` with the fine-tuning setup `yaml_text`; `fields` are the job's, `run`
    RunOptions' (default: one worker, no progress bar)."""
    sft = setup_for(tmp_path, spec, tok, yaml_text, **(overrides or {}))
    inputs = inputs if isinstance(inputs, list) else [inputs]
    return convert(
        ConvertJob(
            inputs=tuple(map(str, inputs)), output=str(tmp_path / out), tokenizer=spec, sft=sft,
            **fields,
        ),
        RunOptions(**{"workers": 1, "progress": False, **(run or {})}),
    )  # fmt: skip


def runs_of(tmp_path, tok, out="out") -> list[list[str]]:
    return [trained_runs(tok, t, m) for t, m in documents(tmp_path / out)]


# -- each format, train_on_input off and on ----------------------------------------------------


def test_sharegpt_trains_the_assistant_turns_with_their_end_token(tmp_path, spec, tok):
    data = write_jsonl(tmp_path / "c.jsonl", [CHAT])
    result = run(tmp_path, spec, tok, SHAREGPT, data)
    assert runs_of(tmp_path, tok) == [["Hello! How are you?<|im_end|>", "Good to hear.<|im_end|>"]]
    assert result.sft["trained_tokens"] == result.manifest.trained_tokens > 0
    assert "trained " in result.summary() and "truncated records 0" in result.summary()
    run(tmp_path, spec, tok, SHAREGPT, data, out="all", overrides={"train_on_input": True})
    ((tokens, mask),) = documents(tmp_path / "all")
    assert mask.all()
    assert decode(tok, tokens) == decode(tok, documents(tmp_path / "out")[0][0])


def test_openai_with_role_map_and_column_map(tmp_path, spec, tok):
    record = {
        "dialog": [
            {"speaker": "customer", "text": "Where is my order?"},
            {"speaker": "agent", "text": "It ships today."},
        ]
    }
    config = (
        "format: openai\ntemplate: chatml\nrole_map: {customer: user, agent: assistant}\n"
        "column_map: {messages: dialog, role: speaker, content: text}\n"
    )
    run(tmp_path, spec, tok, config, write_jsonl(tmp_path / "c.jsonl", [record]))
    assert runs_of(tmp_path, tok) == [["It ships today.<|im_end|>"]]
    ((tokens, _),) = documents(tmp_path / "out")
    assert "<|im_start|>user\nWhere is my order?<|im_end|>" in decode(tok, tokens)


def test_alpaca(tmp_path, spec, tok):
    record = {"instruction": "Add", "input": "2 and 3", "output": "5"}
    data = write_jsonl(tmp_path / "c.jsonl", [record])
    run(tmp_path, spec, tok, "format: alpaca\n", data)
    assert runs_of(tmp_path, tok) == [["5<|endoftext|>"]]
    ((tokens, _),) = documents(tmp_path / "out")
    assert "### Instruction:\nAdd\n\n2 and 3\n\n### Response:\n5" in decode(tok, tokens)
    run(tmp_path, spec, tok, "format: alpaca\ntrain_on_input: true\n", data, out="all")
    ((_, mask),) = documents(tmp_path / "all")
    assert mask.all() or (mask[0] == 0 and mask[1:].all())


def test_prompt_completion(tmp_path, spec, tok):
    record = {"prompt": "The capital of France is", "completion": " Paris."}
    data = write_jsonl(tmp_path / "c.jsonl", [record])
    run(tmp_path, spec, tok, "format: prompt_completion\n", data)
    (runs,) = runs_of(tmp_path, tok)
    assert "".join(runs).endswith("Paris.<|endoftext|>") and "capital" not in "".join(runs)
    run(tmp_path, spec, tok, "format: prompt_completion\n", data, out="all",
        overrides={"train_on_input": True})  # fmt: skip
    (runs,) = runs_of(tmp_path, tok, "all")
    assert "The capital of France is Paris.<|endoftext|>" in "".join(runs)


def test_jq_train_on_input(tmp_path, spec, tok):
    data = write_jsonl(tmp_path / "c.jsonl", [VICUNA])
    run(tmp_path, spec, tok, NOTE_YAML, data, overrides={"train_on_input": True})
    ((tokens, mask),) = documents(tmp_path / "out")
    assert decode(tok, tokens[:1]) == "<s>" and mask[0] == 0 and mask[1:].all()


def test_per_message_override(tmp_path, spec, tok):
    record = {
        "conversations": [
            {"from": "human", "value": "Teach me this", "train": True},
            {"from": "gpt", "value": "Wrong answer", "train": False},
            {"from": "human", "value": "Try again"},
            {"from": "gpt", "value": "Right answer"},
        ]
    }
    run(tmp_path, spec, tok, SHAREGPT, write_jsonl(tmp_path / "c.jsonl", [record]))
    (runs,) = runs_of(tmp_path, tok)
    assert runs[-1] == "Right answer<|im_end|>"
    assert any("Teach me this" in r for r in runs)
    assert not any("Wrong answer" in r or "Try again" in r for r in runs)


# -- bad records --------------------------------------------------------------------------------

GOOD = json.dumps(CHAT)
BAD = [
    ('{"conversations": "hi"}', "not_a_list"),
    (json.dumps({"conversations": [{"from": "bot", "value": "x"}]}), "unknown_role"),
    (json.dumps({"conversations": [{"from": "human", "value": "no answer"}]}), "invalid_conversation"),
    ('{"other": 1}', "missing_field"),
    (json.dumps({"conversations": [{"from": "human", "value": "a <|im_end|> b"},
                                   {"from": "gpt", "value": "c"}]}), "special_token_in_content"),
    (json.dumps({"conversations": [{"from": "human", "value": "q"},
                                   {"from": "gpt", "value": "a", "train": False}]}), "no_loss_tokens"),
    (json.dumps({"conversations": [{"from": "human", "value": "q"},
                                   {"from": "gpt", "value": "word " * 200}]}), "too_long"),
    ('{"conversations": [', "invalid_json"),
    ('{"conversations": [{"from": "gpt", "value": "\\ud800"}]}', "invalid_utf8"),
]  # fmt: skip
LIMITED = SHAREGPT + "max_tokens: 120\n"


def bad_corpus(path: Path, bad=BAD, good=GOOD) -> list[tuple[int, str]]:
    lines, expected = [], []
    for line, reason in bad:
        lines += [good, line]
        expected.append((len(lines), reason))
    lines.append(good)
    write_jsonl(path, lines)
    return expected


def test_skip_counts_every_reason_with_its_line(tmp_path, spec, tok):
    expected = bad_corpus(tmp_path / "c.jsonl")
    result = run(tmp_path, spec, tok, LIMITED, tmp_path / "c.jsonl", on_bad_record="skip")
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == expected
    assert all(r["file"] == str(tmp_path / "c.jsonl") and r["detail"] for r in rejects)
    manifest = json.loads((tmp_path / "out" / "index.json").read_text())
    assert manifest["extra"]["rejected_by_reason"] == {reason: 1 for _, reason in BAD}
    assert result.documents == len(BAD) + 1 and result.records_read == 2 * len(BAD) + 1


def test_jq_error_is_a_bad_record(tmp_path, spec, tok):
    good = json.dumps(VICUNA)
    expected = bad_corpus(tmp_path / "c.jsonl", [('{"conversations": 5}', "jq_error")], good)
    run(tmp_path, spec, tok, NOTE_YAML, tmp_path / "c.jsonl", on_bad_record="skip")
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == expected
    with pytest.raises(BadRecordError, match=r"c\.jsonl, line 2: jq_error: pattern '"):
        run(tmp_path, spec, tok, NOTE_YAML, tmp_path / "c.jsonl", out="err")


@pytest.mark.parametrize("line, reason", BAD, ids=[reason for _, reason in BAD])
def test_error_mode_stops_with_file_line_and_reason(tmp_path, spec, tok, line, reason):
    write_jsonl(tmp_path / "c.jsonl", [GOOD, GOOD, line, GOOD])
    with pytest.raises(BadRecordError) as info:
        run(tmp_path, spec, tok, LIMITED, tmp_path / "c.jsonl")
    assert (info.value.path, info.value.line) == (str(tmp_path / "c.jsonl"), 3)
    assert info.value.reason.startswith(reason + ": ")


# -- settings -----------------------------------------------------------------------------------


def test_truncation_keep_start_is_counted(tmp_path, spec, tok):
    record = {"conversations": [{"from": "human", "value": "q"},
                                {"from": "gpt", "value": "word " * 100}]}  # fmt: skip
    short = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "ok"}]}
    data = write_jsonl(tmp_path / "c.jsonl", [record, short])
    result = run(tmp_path, spec, tok, LIMITED, data, overrides={"truncation": "keep_start",
                                                                "max_tokens": 30})  # fmt: skip
    assert result.sft["truncated_records"] == 1
    assert [len(t) for t, _ in documents(tmp_path / "out")][0] == 30
    assert json.loads((tmp_path / "out" / "index.json").read_text())["sft"]["max_tokens"] == 30


def test_refused_inputs_and_options(tmp_path, spec, tok):
    (tmp_path / "a.txt").write_text("plain text")
    with pytest.raises(UsageError, match=r"a\.txt: --sft reads JSONL or Parquet records"):
        run(tmp_path, spec, tok, SHAREGPT, tmp_path / "a.txt")
    eos = load_tokenizer(str(tok), append_eos=True, backend="hf")
    data = write_jsonl(tmp_path / "c.jsonl", [CHAT])
    with pytest.raises(UsageError, match="the chat template decides BOS/EOS"):
        convert(ConvertJob(inputs=(str(data),), output=str(tmp_path / "o"), tokenizer=eos,
                           sft=setup_for(tmp_path, spec, tok, SHAREGPT)),
                RunOptions(progress=False))  # fmt: skip


def test_parquet_records(tmp_path, spec, tok):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"messages": [{"role": "user", "content": f"Q{i}"},
                          {"role": "assistant", "content": f"A{i}"}], "extra": i}
            for i in range(5)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=2)
    run(tmp_path, spec, tok, "format: openai\ntemplate: chatml\n", tmp_path / "c.parquet")
    assert runs_of(tmp_path, tok) == [[f"A{i}<|im_end|>"] for i in range(5)]


# -- determinism and resume ---------------------------------------------------------------------


def corpus(path: Path) -> Path:
    records = []
    for i in range(120):
        turns = [{"from": "human", "value": f"Question {i}? " * (1 + i % 5)},
                 {"from": "gpt", "value": f"Answer {i}. " * (1 + i % 7)}]  # fmt: skip
        records.append({"conversations": turns} if i % 17 else {"conversations": "bad"})
    return write_jsonl(path, records)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_same_bytes_for_any_worker_count_and_start_method(tmp_path, spec, tok, start_method):
    data = corpus(tmp_path / "c.jsonl")
    common = {"on_bad_record": "skip", "unit_size": 2048, "frame_size": 512}
    run(tmp_path, spec, tok, SHAREGPT, data, out="one", **common)
    run(tmp_path, spec, tok, SHAREGPT, data, out="three",
        run={"workers": 3, "start_method": start_method}, **common)  # fmt: skip
    one, three = dataset_bytes(tmp_path / "one"), dataset_bytes(tmp_path / "three")
    assert one == three and "rejects.jsonl" in one
    assert json.loads(one["index.json"])["trained_tokens"] > 0


def test_resume_reuses_units_with_their_masks(tmp_path, spec, tok):
    data = corpus(tmp_path / "c.jsonl")
    common = {"on_bad_record": "skip", "unit_size": 2048}
    run(tmp_path, spec, tok, SHAREGPT, data, out="clean", **common)
    first = run(tmp_path, spec, tok, SHAREGPT, data, out="kept", run={"keep_work": True}, **common)
    for name in ("index.json", "rejects.jsonl"):
        (tmp_path / "kept" / name).unlink()
    for shard in (tmp_path / "kept").glob("*.tar"):
        shard.unlink()
    again = run(tmp_path, spec, tok, SHAREGPT, data, out="kept", **common)
    assert again.units_reused == first.units_total > 1 and again.units_tokenized == 0
    assert dataset_bytes(tmp_path / "kept") == dataset_bytes(tmp_path / "clean")


def test_units_of_a_plain_run_never_serve_an_sft_run(tmp_path, spec, tok, caplog):
    data = corpus(tmp_path / "c.jsonl")
    plain = load_tokenizer(str(tok), append_eos=False, backend="hf")
    convert(ConvertJob(inputs=(str(data),), output=str(tmp_path / "o"), tokenizer=plain,
                       text_key="conversations", on_bad_record="skip"),
            RunOptions(workers=1, progress=False, keep_work=True))  # fmt: skip
    (tmp_path / "o" / "index.json").unlink()
    result = run(tmp_path, spec, tok, SHAREGPT, data, out="o", on_bad_record="skip")
    assert "starting over" in caplog.text
    assert result.units_reused == 0 and result.manifest.masked
    shutil.rmtree(tmp_path / "o")


def test_work_units_check_their_masks(tmp_path):
    import zlib

    import numpy as np

    from shardtok.convert.job.unit_result import UnitResult
    from shardtok.convert.job.workdir import WorkDir

    work = WorkDir(tmp_path)
    work.start({"plan": 1})
    u16 = np.dtype(np.uint16)
    counts = {"trained_tokens": 0, "boundary_tokens": 0, "truncated_records": 0, "jq_rewrites": []}

    def save(index: int, mask: bytes | None):
        sft = None if mask is None else dict(counts, trained_tokens=1)
        result = UnitResult(index, 1, 3, 10, [1], 1, [], [[0, 6, 6, 0]], [1, None], sft=sft)
        files = {"t": b"\1" * 6, "f": b"\2" * 6, "m": mask or b""}
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
        masks = None if mask is None else (tmp_path / "m", zlib.crc32(mask))
        crcs = (zlib.crc32(files["t"]), zlib.crc32(files["f"]))
        docs = np.asarray([[0, 1, 3]], dtype=np.int64)
        work.save_unit(result, tmp_path / "t", tmp_path / "f", docs, crcs, masks)

    save(0, None)
    assert isinstance(work.load_result(0, u16), UnitResult)
    assert work.load_result(0, u16, masks=True) == "it has no loss masks"
    save(1, b"\0\1\1")
    assert work.load_result(1, u16, masks=True).sft["trained_tokens"] == 1
    assert work.load_masks(1).tolist() == [0, 1, 1]
    assert work.load_result(1, u16) == "it has loss masks and this run has none"
    (work.path / "unit-000001.mask").write_bytes(b"\1\1\1")
    assert work.load_result(1, u16, masks=True) == "unit-000001.mask fails its crc32 check"


# -- the command line ---------------------------------------------------------------------------


def cli(tmp_path, tok, *args: str) -> int:
    (tmp_path / "sft.yaml").write_text(SHAREGPT)
    data = write_jsonl(tmp_path / "c.jsonl", [CHAT])
    base = ["convert", str(data), "-o", str(tmp_path / "cli"), "--tokenizer", str(tok)]
    return main([*base, "--workers", "1", *args])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--append-eos"], "--append-eos does not apply to fine-tuning data: the chat template decides BOS/EOS"),
        (["--prepend-bos"], "--prepend-bos does not apply to fine-tuning data"),
        (["--text-key", "x"], "--text-key does not apply to fine-tuning data"),
    ],
)  # fmt: skip
def test_cli_refusals_with_sft(tmp_path, tok, capsys, args, message):
    assert cli(tmp_path, tok, "--sft", str(tmp_path / "sft.yaml"), *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("flag", [["--chat-template", "chatml"], ["--train-on-input"],
                                  ["--max-tokens", "9"], ["--truncation", "turns"]])  # fmt: skip
def test_cli_sft_overrides_need_the_records_format(tmp_path, tok, capsys, flag):
    assert cli(tmp_path, tok, *flag) == 2
    assert (
        f"{flag[0]} needs the records' format: add --sft-format (sharegpt, openai, alpaca, "
        "prompt_completion, jq), or --sft CONFIG.yaml" in capsys.readouterr().err
    )


def test_cli_sft_format_describes_the_records_without_a_yaml(tmp_path, tok):
    assert cli(tmp_path, tok, "--sft-format", "sharegpt", "--chat-template", "chatml") == 0
    assert runs_of(tmp_path, tok, "cli") == [["Hello! How are you?<|im_end|>",
                                               "Good to hear.<|im_end|>"]]  # fmt: skip


def test_cli_sft_run_and_inspect_show_the_trained_share(tmp_path, tok, capsys):
    status = cli(tmp_path, tok, "--sft", str(tmp_path / "sft.yaml"), "--no-append-eos",
                 "--max-tokens", "500", "--truncation", "turns")  # fmt: skip
    assert status == 0
    out = capsys.readouterr().out
    assert "  trained     " in out and "boundary tokens" in out
    manifest = json.loads((tmp_path / "cli" / "index.json").read_text())
    assert manifest["sft"]["truncation"] == "turns" and manifest["sft"]["template"] == "chatml"
    assert manifest["extra"]["convert"]["append_eos"] is False
    assert main(["inspect", str(tmp_path / "cli")]) == 0
    assert "trained tokens" in capsys.readouterr().out


def test_cli_overrides_switch_the_format(tmp_path, tok, capsys):
    record = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    data = write_jsonl(tmp_path / "m.jsonl", [record])
    (tmp_path / "sft.yaml").write_text("format: sharegpt\n")
    status = main(["convert", str(data), "-o", str(tmp_path / "m"), "--tokenizer", str(tok),
                   "--sft", str(tmp_path / "sft.yaml"), "--sft-format", "openai",
                   "--chat-template", "chatml", "-q", "--workers", "1"])  # fmt: skip
    assert status == 0
    assert runs_of(tmp_path, tok, "m") == [["yo<|im_end|>"]]
