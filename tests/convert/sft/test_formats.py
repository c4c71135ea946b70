"""Records to Conversations: each format, column_map/role_map, the per-message override, and
every bad-record reason with a detail that names the message."""

from __future__ import annotations

import pytest

from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.conversation import Conversation, Message, SFTBad
from shardtok.convert.sft.formats import make_converter, to_conversation


def config(tmp_path, text: str):
    path = tmp_path / "sft.yaml"
    path.write_text(text)
    return load_sft_config(path, {})


def messages(result) -> list[tuple]:
    assert isinstance(result, Conversation), result
    return [(m.role, m.content, m.train) for m in result.messages]


def test_sharegpt(tmp_path):
    record = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello", "train": False},
            {"from": "human", "value": "Again"},
            {"from": "gpt", "value": "Hello again"},
        ]
    }
    got = messages(to_conversation(record, config(tmp_path, "format: sharegpt\n")))
    assert got == [
        ("system", "Be brief.", None),
        ("user", "Hi", None),
        ("assistant", "Hello", False),  # the per-message override
        ("user", "Again", None),
        ("assistant", "Hello again", None),
    ]


def test_sharegpt_with_column_map_and_role_map(tmp_path):
    text = (
        "format: sharegpt\ncolumn_map: {conversations: data.dialog, from: speaker, value: text,"
        " train: learn}\nrole_map: {customer: user, agent: assistant}\n"
    )
    record = {
        "data": {
            "dialog": [
                {"speaker": "customer", "text": "My order?"},
                {"speaker": "agent", "text": "Shipped.", "learn": True},
                {"speaker": "user", "text": "Thanks"},  # canonical roles still work
                {"speaker": "assistant", "text": "Welcome"},
            ]
        }
    }
    got = messages(to_conversation(record, config(tmp_path, text)))
    assert got == [
        ("user", "My order?", None),
        ("assistant", "Shipped.", True),
        ("user", "Thanks", None),
        ("assistant", "Welcome", None),
    ]


def test_openai(tmp_path):
    record = {
        "messages": [
            {"role": "user", "content": "2+2?", "train": True},
            {"role": "assistant", "content": "4", "name": "ignored extra key"},
        ]
    }
    got = messages(to_conversation(record, config(tmp_path, "format: openai\n")))
    assert got == [("user", "2+2?", True), ("assistant", "4", None)]


def test_openai_role_map(tmp_path):
    conf = config(tmp_path, "format: openai\nrole_map: {developer: system}\n")
    record = {
        "messages": [
            {"role": "developer", "content": "Rules"},
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"},
        ]
    }
    assert messages(to_conversation(record, conf))[0] == ("system", "Rules", None)


def test_alpaca(tmp_path):
    conf = config(tmp_path, "format: alpaca\n")
    with_input = {"instruction": "Translate", "input": "chat", "output": "cat", "system": "S"}
    assert messages(to_conversation(with_input, conf)) == [
        ("system", "S", None),
        ("user", "Translate\n\nchat", None),
        ("assistant", "cat", None),
    ]
    for empty in ({"input": ""}, {"input": None}, {}):
        record = {"instruction": "Say hi", "output": "hi", **empty}
        assert messages(to_conversation(record, conf)) == [
            ("user", "Say hi", None),
            ("assistant", "hi", None),
        ]


def test_alpaca_column_map(tmp_path):
    conf = config(tmp_path, "format: alpaca\ncolumn_map: {instruction: q, input: ctx, output: a}\n")
    record = {"q": "Sum", "ctx": "1 2", "a": "3"}
    assert messages(to_conversation(record, conf)) == [
        ("user", "Sum\n\n1 2", None),
        ("assistant", "3", None),
    ]


def test_prompt_completion(tmp_path):
    conf = config(tmp_path, "format: prompt_completion\ncolumn_map: {completion: answer}\n")
    record = {"prompt": "The capital of France is", "answer": " Paris."}
    assert messages(to_conversation(record, conf)) == [
        ("user", "The capital of France is", None),
        ("assistant", " Paris.", None),
    ]


SHAREGPT_BAD = [
    ({"conversations": "hi"}, "not_a_list", "field 'conversations' is a str, not a list"),
    ({"conversations": {"from": "human"}}, "not_a_list", "is a dict, not a list"),
    ({"other": []}, "missing_field", "no field 'conversations'"),
    ({"conversations": None}, "missing_field", "field 'conversations' is null"),
    ({"conversations": []}, "invalid_conversation", "is an empty list"),
    (
        {"conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]},
        "unknown_role",
        "message 1: role 'bot' is not one of system, user, assistant, human, gpt "
        "(add it to role_map)",
    ),
    ({"conversations": ["hi"]}, "invalid_conversation", "message 0 is a str, not an object"),
    ({"conversations": [{"value": "a"}]}, "invalid_conversation", "message 0 has no 'from'"),
    ({"conversations": [{"from": 3, "value": "a"}]}, "invalid_conversation", "'from' is 3"),
    ({"conversations": [{"from": "gpt"}]}, "invalid_conversation", "message 0 has no 'value'"),
    (
        {"conversations": [{"from": "gpt", "value": 7}]},
        "invalid_conversation",
        "message 0: 'value' is a int, not a string",
    ),
    (
        {"conversations": [{"from": "gpt", "value": None}]},
        "invalid_conversation",
        "message 0: 'value' is null, not a string",
    ),
    (
        {"conversations": [{"from": "gpt", "value": "a", "train": "yes"}]},
        "invalid_conversation",
        "message 0: 'train' is 'yes', not true or false",
    ),
    (
        {"conversations": [{"from": "human", "value": "only a question"}]},
        "invalid_conversation",
        "no assistant message",
    ),
    (
        {"conversations": [{"from": "gpt", "value": "lone \ud800 surrogate"}]},
        "invalid_utf8",
        "message 0: 'value': surrogates not allowed",
    ),
    (["a", "list"], "invalid_conversation", "the record is a list, not an object"),
]


@pytest.mark.parametrize("record, reason, detail", SHAREGPT_BAD)
def test_sharegpt_bad_records(tmp_path, record, reason, detail):
    result = to_conversation(record, config(tmp_path, "format: sharegpt\n"))
    assert isinstance(result, SFTBad)
    assert result.reason == reason
    assert detail in result.detail


@pytest.mark.parametrize(
    "fmt, record, reason, detail",
    [
        ("alpaca", {"output": "x"}, "missing_field", "no field 'instruction'"),
        ("alpaca", {"instruction": "x"}, "missing_field", "no field 'output'"),
        ("alpaca", {"instruction": 1, "output": "x"}, "invalid_conversation", "'instruction' is a int"),
        ("alpaca", {"instruction": "i", "input": 2, "output": "x"}, "invalid_conversation", "'input'"),
        ("alpaca", {"instruction": "i", "output": "x", "system": []}, "invalid_conversation", "'system'"),
        ("prompt_completion", {"prompt": "p"}, "missing_field", "no field 'completion'"),
        ("openai", {"messages": [{"role": "tool", "content": "x"}]}, "unknown_role", "role 'tool'"),
        ("openai", {"messages": [{"role": "assistant", "content": None}]}, "invalid_conversation", "'content' is null"),
    ],
)  # fmt: skip
def test_other_formats_bad_records(tmp_path, fmt, record, reason, detail):
    result = to_conversation(record, config(tmp_path, f"format: {fmt}\n"))
    assert isinstance(result, SFTBad) and result.reason == reason
    assert detail in result.detail


def test_a_converter_is_reused_across_records(tmp_path):
    convert = make_converter(config(tmp_path, "format: openai\n"))
    a = convert({"messages": [{"role": "assistant", "content": "1"}]})
    b = convert({"messages": [{"role": "assistant", "content": "2"}]})
    assert a.messages == (Message("assistant", "1"),) and b.messages == (Message("assistant", "2"),)
