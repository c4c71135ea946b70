"""JSONL text records through orjson (the optional fast path) and through json.loads (its
stdlib twin) come out the same: the same texts, the same rejects with the same messages."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from shardtok.convert import records
from shardtok.convert.inputs import InputFile
from shardtok.convert.records import RangeReader, Reject, TextRun
from shardtok.convert.units import InputRange

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


def _flatten(entries) -> list[tuple[int, str | Reject]]:
    out = []
    for entry in entries:
        if isinstance(entry, TextRun):
            assert len(entry.numbers) == len(entry.texts) > 0
            assert all(type(t) is str for t in entry.texts)
            out += zip(entry.numbers, entry.texts)
        else:
            out.append(entry)
    return out


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("key", ["text", "meta.body"])
def test_runs_are_the_records_iteration_gives(tmp_path, monkeypatch, key, compression):
    """RangeReader.runs (the tokenizer's way) gives the records, numbers and rejects that
    iterating gives, good texts gathered into runs; a compressed stream comes in chunks."""
    monkeypatch.setattr(records, "_CHUNK_BYTES", 300)  # many chunks, runs cut at their ends
    rng = random.Random(7)
    good = [b'{"text": "t%d", "meta": {"body": "b%d"}}' % (i, i) for i in range(400)]
    lines = [rng.choice(LINES) if rng.random() < 0.3 else g for g in good]
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / ("c.jsonl" + (".gz" if compression else ""))
    path.write_bytes(gzip.compress(data) if compression else data)
    size = path.stat().st_size
    file = InputFile(str(path), "jsonl", compression, size, path.stat().st_mtime_ns)

    def reader():
        return RangeReader(file, InputRange(0, 0, size), key, "lines")

    whole = reader()
    expected = list(whole)
    by_runs = reader()
    entries = list(by_runs.runs())
    assert _flatten(entries) == expected and by_runs.records == whole.records == len(lines)
    runs = [e for e in entries if isinstance(e, TextRun)]
    assert max(len(r.texts) for r in runs) > 1  # runs really gather records
    # ... never beyond a chunk of ~300 bytes of lines, whether the piece is read whole or
    # streamed (a chunk ends with the line that reaches 300 bytes)
    longest = max(map(len, lines)) + 1
    assert max(sum(len(lines[n - 1]) + 1 for n in r.numbers) for r in runs) <= 300 + longest


def test_runs_of_a_reader_without_the_fast_path_are_its_records(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(LINES) + b"\n")
    monkeypatch.setattr(records, "_orjson_loads", None)
    assert list(read_runs(path)) == read(path, "text")


def read_runs(path):
    size = path.stat().st_size
    file = InputFile(str(path), "jsonl", None, size, path.stat().st_mtime_ns)
    return RangeReader(file, InputRange(0, 0, size), "text", "lines").runs()
