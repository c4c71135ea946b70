"""The jq format: path patterns, the retry of the note's pattern, and the construction renderer."""

from __future__ import annotations

import pickle

import pytest

from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.construction import ConstructionRenderer, jq_renderer
from shardtok.convert.sft.conversation import Conversation, Message, SFTBad
from shardtok.convert.sft.jq_patterns import JqPatterns, rewrite
from shardtok.convert.sft.setup import prepare_sft
from shardtok.convert.tokenizing.tokenizer import load_tokenizer
from shardtok.errors import UsageError
from tests.helpers.sft_data import NOTE_YAML, VICUNA, special_tokenizer


def jq_config(tmp_path, text: str = NOTE_YAML, **overrides):
    path = tmp_path / "note.yaml"
    path.write_text(text)
    return load_sft_config(path, overrides)


def test_patterns_give_exact_paths():
    patterns = JqPatterns(('.conversations[] | select(.from == "human")', ".instruction"))
    assert patterns.excluded(VICUNA) == [
        ["conversations", 0],
        ["conversations", 2],
        ["conversations", 4],
        ["instruction"],
    ]
    assert patterns.rewrites == []


def test_the_note_pattern_is_retried_with_brackets_and_remembered():
    note = '.conversations | select(.from == "human")'
    patterns = JqPatterns((note,))
    assert patterns.excluded(VICUNA) == [
        ["conversations", 0],
        ["conversations", 2],
        ["conversations", 4],
    ]
    assert patterns.rewrites == [(note, '.conversations[] | select(.from == "human")')]
    patterns.excluded(VICUNA)
    assert len(patterns.rewrites) == 1  # said once, however many records need it


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ('.conversations | select(.from == "human")', '.conversations[] | select(.from == "human")'),
        (".a.b|select(.x)", ".a.b[] | select(.x)"),
        ('."odd key" | .x', '."odd key"[] | .x'),
        ('.["k"][0] | .x', '.["k"][0][] | .x'),
        (".instruction", None),  # no pipe: nothing to retry
        ("(.a) | .b", None),  # not a plain leading path
    ],
)  # fmt: skip
def test_rewrite(pattern, expected):
    assert rewrite(pattern) == expected


def test_an_invalid_pattern_is_a_usage_error_at_start_up(tmp_path):
    with pytest.raises(
        UsageError, match=r"^sft.yaml: invalid jq pattern '\.conversations\[': syntax error, [^:]*$"
    ):
        JqPatterns((".conversations[",), "sft.yaml")


def test_a_pattern_failing_on_a_record_is_jq_error():
    patterns = JqPatterns(('.conversations[] | select(.from == "human")',))
    bad = patterns.excluded({"conversations": "a string"})
    assert isinstance(bad, SFTBad) and bad.reason == "jq_error"
    assert "Cannot iterate over string" in bad.detail
    retried = JqPatterns(('.conversations | select(.from == "human")',))
    bad = retried.excluded({"conversations": [1, 2]})
    assert bad.reason == "jq_error" and "retried as '.conversations[] |" in bad.detail


def test_slices_and_deeper_paths_exclude_their_messages(tmp_path):
    text = "loss_masking_jq_patterns: ['.conversations[0:2]', '.conversations[4].value']\n"
    text += "message_construction: [conversations]\n"
    from shardtok.convert.sft.formats import make_converter

    conversation = make_converter(jq_config(tmp_path, text))(VICUNA)
    assert [m.train for m in conversation.messages] == [False, False, True, True, False, True]


def test_the_jq_format_names_pieces_and_honours_overrides(tmp_path):
    from shardtok.convert.sft.formats import make_converter

    record = dict(
        VICUNA,
        conversations=[dict(VICUNA["conversations"][0], train=True), *VICUNA["conversations"][1:]],
    )
    conversation = make_converter(jq_config(tmp_path))(record)
    roles = [m.role for m in conversation.messages]
    assert roles == ["role", "instruction", "human", "gpt", "human", "gpt", "human", "gpt"]
    assert [m.train for m in conversation.messages] == [
        False,
        False,
        True,
        True,
        False,
        True,
        False,
        True,
    ]
    everything = make_converter(jq_config(tmp_path, train_on_input=True))(VICUNA)
    assert all(m.train for m in everything.messages)


@pytest.mark.parametrize(
    "record, reason, detail",
    [
        ({"conversations": [{"from": "gpt"}]}, "invalid_conversation", "conversations[0] has neither 'value' nor 'content'"),
        ({"conversations": ["x"]}, "jq_error", "Cannot index string with string"),
        ({"conversations": [{"from": "gpt", "value": 1}]}, "invalid_conversation", "conversations[0]: 'value' is a int"),
        ({"role": 5, "conversations": []}, "invalid_conversation", "field 'role' is a int"),
        ({"conversations": [{"from": "gpt", "value": "a", "train": 1}]}, "invalid_conversation", "'train' is 1"),
        ({"id": 3}, "missing_field", "none of the fields role, instruction, conversations"),
        ({"conversations": {"from": "human"}}, "invalid_conversation", "field 'conversations' is a dict"),
    ],
)  # fmt: skip
def test_jq_bad_records(tmp_path, record, reason, detail):
    from shardtok.convert.sft.formats import make_converter

    result = make_converter(jq_config(tmp_path))(record)
    assert isinstance(result, SFTBad) and result.reason == reason, result
    assert detail in result.detail


def test_construction_spans():
    renderer = ConstructionRenderer("<s>", "</s>", " | ")
    conversation = Conversation(
        (
            Message("instruction", "Do", False),
            Message("gpt", "Done", True),
            Message("human", "", False),
        )
    )
    rendered = renderer.render(conversation)
    assert rendered.text == "<s>Do | Done |  | </s>"
    assert [rendered.text[a:b] for a, b in rendered.trained] == ["Done | "]
    assert [rendered.text[a:b] for a, b in rendered.content] == ["Do", "Done"]
    assert [(rendered.text[a:b], t) for a, b, t in rendered.turns] == [
        ("Do | ", False),
        ("Done | ", True),
        (" | ", False),
    ]
    last = renderer.render(Conversation((Message("a", "x", False), Message("b", "y", True))))
    assert [last.text[a:b] for a, b in last.trained] == ["y | </s>"]  # EOS follows a trained end
    assert pickle.loads(pickle.dumps(renderer)).render(conversation) == rendered


def test_special_tokens_must_be_the_tokenizers(tmp_path):
    bundled = load_tokenizer("bundled", append_eos=False)
    with pytest.raises(UsageError, match=r"special_tokens bos_token '<s>' is not a special token"):
        jq_renderer(jq_config(tmp_path), bundled)
    spec = load_tokenizer(str(special_tokenizer(tmp_path / "tok")), append_eos=False, backend="hf")
    setup = prepare_sft(jq_config(tmp_path), spec, tmp_path / "tok")
    assert setup.renderer.eos_token == "</s>" and setup.metadata["format"] == "jq"
    bad_pattern = NOTE_YAML.replace(".instruction", ".instruction[")
    with pytest.raises(UsageError, match="invalid jq pattern"):
        prepare_sft(jq_config(tmp_path, bad_pattern), spec, tmp_path / "tok")
