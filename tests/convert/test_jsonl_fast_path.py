"""JSONL text records through orjson (the optional fast path) and through json.loads (its
stdlib twin) come out the same: the same texts, the same rejects with the same messages."""

from __future__ import annotations

import json

import pytest

from shardtok.convert.inputs import records
from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.records import RangeReader, Reject
from shardtok.convert.inputs.units import InputRange

pytest.importorskip("orjson")

LINES = [
    b'{"text": "plain"}',
    b'{"text": "unterminated',
    b'{"other": "no text field"}',
    b'["not", "an", "object"]',
    b'"a string"',
    b'{"text": 42}',
    b'{"text": null}',
    b'{"text": "bad byte \xff here"}',
    b'{"text": "lone surrogate \\ud800"}',
    b'{"text": "a\\udc80b"}',
    b'{"text": ""}',
    b'{"text": "  \\n\\t "}',
    b'{"text": "\\u2003\\u3000"}',  # Unicode whitespace only: empty too
    b'{"text": NaN}',
    b'{"text": "fine", "n": NaN}',  # json.loads takes NaN, orjson does not: same text either way
    b'{"text": "big", "n": 123456789012345678901234567890}',
    b'{"text": "inf", "n": 1e400}',
    b'\xef\xbb\xbf{"text": "after a byte-order mark"}',
    b'{"text": "first", "text": "second"}',
    b'{"text": "tab\\tescapes \\u00e9 \\ud83d\\ude00 \\"q\\" \\\\"}',
    b'{"text": "raw control \x01"}',
    b'{"text": "del \x7f ok"}',
    b'  {"text": "padded"}  ',
    b'{"text": "crlf"}\r',
    b"",
    b"   ",
    b'{"text": "trailing comma",}',
    b'{"text": 01}',
    b'{"meta": {"body": "nested"}, "text": "top"}',
    b'{"meta": {"body": 7}, "text": "top"}',
    b'{"meta": "not an object", "text": "top"}',
    b'{"meta": {"body": "  "}, "text": "top"}',
    b'{"text": "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"}',
]


def read(path, key: str) -> list[tuple[int, str | Reject]]:
    size = path.stat().st_size
    file = InputFile(str(path), "jsonl", None, size, path.stat().st_mtime_ns)
    return list(RangeReader(file, InputRange(0, 0, size), key, "lines"))


@pytest.mark.parametrize("key", ["text", "meta.body"])
def test_orjson_and_json_loads_read_the_same_records(tmp_path, monkeypatch, key):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(LINES) + b"\n")
    fast = read(path, key)
    calls = []
    real_loads = json.loads
    monkeypatch.setattr(records.json, "loads", lambda s: calls.append(s) or real_loads(s))
    fast_again = read(path, key)
    # The fast path really answered: json.loads saw only the lines it declined.
    answered = (
        '{"text": "plain"}' if key == "text" else '{"meta": {"body": "nested"}, "text": "top"}'
    )
    assert answered not in calls and '{"text": "fine", "n": NaN}' in calls
    monkeypatch.setattr(records, "_orjson_loads", None)
    slow = read(path, key)
    assert fast == slow == fast_again
    texts = [value for _, value in fast if isinstance(value, str)]
    if key == "text":
        assert "plain" in texts and "second" in texts and "fine" in texts and "crlf" in texts
        reasons = {value.reason for _, value in fast if isinstance(value, Reject)}
        assert reasons == set(records.REASONS)
