"""The --sft YAML: defaults per format, the note's keys as written, overrides, one-line refusals."""

from __future__ import annotations

import pytest

from shardtok.convert.sft.config import load_sft_config
from shardtok.errors import UsageError
from tests.helpers.sft_data import NOTE_YAML


def load(tmp_path, text: str, **overrides):
    path = tmp_path / "sft.yaml"
    path.write_text(text)
    return load_sft_config(path, overrides)


def refused(tmp_path, text: str, **overrides) -> str:
    with pytest.raises(UsageError) as info:
        load(tmp_path, text, **overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_note_yaml_as_written_is_the_jq_format(tmp_path):
    config = load(tmp_path, NOTE_YAML)
    assert config.format == "jq"
    assert config.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    assert config.loss_masking_jq_patterns[0] == '.conversations | select(.from == "human")'
    assert config.message_construction == ("role", "instruction", "conversations")
    assert config.separator == "\n" and config.train_on_input is False
    assert config.record_fields() is None  # jq patterns may look at any field


@pytest.mark.parametrize(
    "fmt, template, columns",
    [
        ("sharegpt", "tokenizer", {"conversations", "from", "value", "train"}),
        ("openai", "tokenizer", {"messages", "role", "content", "train"}),
        ("alpaca", "alpaca", {"instruction", "input", "output", "system"}),
        ("prompt_completion", "raw", {"prompt", "completion", "system"}),
    ],
)
def test_defaults_per_format(tmp_path, fmt, template, columns):
    config = load(tmp_path, f"format: {fmt}\n")
    assert config.template == template
    assert set(config.column_map) == columns
    assert config.train_roles == ("assistant",) and config.truncation == "drop"
    assert config.max_tokens is None and config.split_special_tokens is False


def test_role_map_extends_the_sharegpt_defaults(tmp_path):
    config = load(tmp_path, "format: sharegpt\nrole_map: {bot: assistant, gpt: user}\n")
    assert config.role_map["bot"] == "assistant"
    assert config.role_map["gpt"] == "user"  # the user's entry wins
    assert config.role_map["human"] == "user" and config.role_map["assistant"] == "assistant"
    openai = load(tmp_path, "format: openai\n")
    assert openai.role_map == {"system": "system", "user": "user", "assistant": "assistant"}


def test_column_map_renames_and_parquet_reads_only_those_fields(tmp_path):
    config = load(
        tmp_path, "format: sharegpt\ncolumn_map: {conversations: data.dialog, from: speaker}\n"
    )
    assert config.column("conversations") == "data.dialog"
    assert config.column("from") == "speaker" and config.column("value") == "value"
    assert {"data.dialog", "data"} <= set(config.record_fields())


def test_overrides_win_over_the_file(tmp_path):
    text = "format: sharegpt\ntemplate: chatml\nmax_tokens: 100\ntruncation: turns\n"
    config = load(
        tmp_path, text, format="openai", template="llama3", train_on_input=True,
        max_tokens=7, truncation="keep_start",
    )  # fmt: skip
    assert (config.format, config.template, config.train_on_input) == ("openai", "llama3", True)
    assert (config.max_tokens, config.truncation) == (7, "keep_start")
    same = load(tmp_path, text, format=None, template=None)  # None: not given
    assert (same.format, same.template, same.max_tokens) == ("sharegpt", "chatml", 100)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("format: sharegpt\ncolum_map: {}\n", "unknown key 'colum_map' (did you mean 'column_map'?)"),
        ("format: sharegpd\n", "(did you mean 'sharegpt'?)"),
        ("format: sharegpt\ntrain_on_input: yes please\n", "'train_on_input' must be true or false"),
        ("format: sharegpt\nmax_tokens: -3\n", "'max_tokens' must be a positive integer"),
        ("format: sharegpt\nmax_tokens: true\n", "'max_tokens' must be a positive integer"),
        ("format: sharegpt\ntruncation: middle\n", "'truncation' must be one of drop, turns, keep_start"),
        ("format: alpaca\nrole_map: {a: user}\n", "'role_map' does not apply to format alpaca"),
        ("format: jq\nmessage_construction: [a]\ntemplate: chatml\n", "'template' does not apply to format jq"),
        ("format: sharegpt\nseparator: x\n", "'separator' does not apply to format sharegpt"),
        ("format: sharegpt\nrole_map: {bot: robot}\n", "maps 'bot' to 'robot', which is not one of"),
        ("format: sharegpt\ncolumn_map: {messages: m}\n", "has no entry 'messages'"),
        ("format: sharegpt\ntrain_roles: [assistant, tool]\n", "lists 'tool'"),
        ("format: sharegpt\ntrain_roles: []\n", "must be a non-empty list"),
        ("format: jq\n", "jq needs 'message_construction'"),
        ("format: jq\nmessage_construction: role\n", "'message_construction' must be a non-empty list"),
        ("special_tokens: {bos: <s>}\nmessage_construction: [a]\n", "has no entry 'bos'; it knows bos_token, eos_token"),
        ("template: chatml\n", "no 'format'"),
        ("- a\n- b\n", "a mapping of settings, not a list"),
        ("format: [unclosed\n", "not valid YAML at line"),
    ],
)  # fmt: skip
def test_mistakes_are_one_line_naming_file_and_key(tmp_path, text, expected):
    message = refused(tmp_path, text)
    assert message.startswith(str(tmp_path / "sft.yaml"))
    assert expected in message


def test_an_override_that_does_not_apply_names_the_flag(tmp_path):
    message = refused(tmp_path, NOTE_YAML, template="chatml")
    assert message == "--chat-template does not apply to format jq"
    assert refused(tmp_path, "format: sharegpt\n", truncation="middle").startswith("--truncation")


def test_a_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read the SFT config"):
        load_sft_config(tmp_path / "nope.yaml", {})


def test_yaml_is_read_safely(tmp_path):
    # A python/object tag would run code under yaml.load; safe_load refuses it.
    message = refused(tmp_path, "format: !!python/object/apply:os.system ['true']\n")
    assert "not valid YAML" in message


def test_metadata_records_every_setting_and_the_template_hash(tmp_path):
    config = load(tmp_path, "format: sharegpt\ntemplate: chatml\n")
    meta = config.as_metadata("chatml", "{{ x }}")
    assert meta["format"] == "sharegpt" and meta["template"] == "chatml"
    assert meta["template_name"] == "chatml" and len(meta["template_sha256"]) == 64
    for key in ("column_map", "role_map", "train_on_input", "train_roles", "max_tokens",
                "truncation", "split_special_tokens"):  # fmt: skip
        assert key in meta
    assert config.as_metadata("chatml", "{{ y }}")["template_sha256"] != meta["template_sha256"]
    jq_meta = load(tmp_path, NOTE_YAML).as_metadata()
    assert "template" not in jq_meta and jq_meta["message_construction"] == [
        "role",
        "instruction",
        "conversations",
    ]
