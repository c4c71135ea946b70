"""RangeReader.runs, the tokenizer's way of reading a piece: the records, numbers and rejects
that iterating gives, with stretches of good texts gathered into TextRuns (JSONL read with
orjson, Parquet and Arrow), never more than a chunk of lines at a time."""

from __future__ import annotations

import gzip
import random

import pytest

from shardtok.convert.inputs import records
from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.records import RangeReader, Reject, TextRun
from shardtok.convert.inputs.units import InputRange
from tests.convert.test_jsonl_fast_path import LINES, read


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


VALUES = ["a text", "", "   ", None, "another", "\u3000", "third", "fourth", "fifth", "x"]


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_table_runs_are_the_records_iteration_gives(tmp_path, kind):
    pa = pytest.importorskip("pyarrow")
    rng = random.Random(3)
    texts = [rng.choice(VALUES) for _ in range(300)]
    table = pa.table({"text": texts, "n": list(range(300)), "meta": [{"t": t} for t in texts]})
    path = tmp_path / f"c.{kind}"
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=300)
        piece = InputRange(0, 0, 0, row_group=0)
    else:
        import pyarrow.feather as feather

        feather.write_feather(table, path, compression="uncompressed")
        piece = None
    file = InputFile(str(path), kind, None, path.stat().st_size, path.stat().st_mtime_ns)
    if piece is None:  # the Arrow file's one record batch, as the planner cuts it
        from shardtok.convert.inputs.units import plan_units

        (unit,) = plan_units([file], 1 << 30, "lines", None)
        (piece,) = unit.pieces
    for key in ("text", "meta.t", "n"):
        whole = RangeReader(file, piece, key, "lines")
        expected = list(whole)
        by_runs = RangeReader(file, piece, key, "lines")
        entries = list(by_runs.runs())
        assert _flatten(entries) == expected and by_runs.records == whole.records == 300
        runs = [e for e in entries if isinstance(e, TextRun)]
        if key == "text":
            assert max(len(r.texts) for r in runs) > 1
        else:  # a nested key or a column of numbers: one record at a time, as before
            assert runs == []
