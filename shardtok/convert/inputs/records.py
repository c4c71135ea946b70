"""Reading the records of one piece: text documents, or the reason a record is rejected.

Record numbers count from 1 within the piece: lines for JSONL and txt, rows for Parquet and
Arrow, and 1 for a whole-file txt document. The assembler adds the records of earlier pieces of
the same file to turn them into file line/row numbers. Blank lines are separators, not records.

Parquet and Arrow pieces are tables (table_pieces.py: a row group, a run of record batches, or a
row range of one, decoded once per worker and validated); JSONL and txt pieces are lines.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass

from shardtok.convert.inputs.compressed import DamagedInputError, open_decompressed, open_parquet
from shardtok.convert.inputs.files import (
    ARROW_SCAN_BLOCK,
    PARQUET_BLOCK,
    STREAM_BLOCK,
    InputFile,
    open_input,
    read_input_range,
)
from shardtok.convert.inputs.table_pieces import ArrowPiece, BlockCache, ParquetPiece
from shardtok.convert.inputs.units import InputRange
from shardtok.storage.location import is_local

try:  # optional: parses a JSONL line 2-3x faster than json.loads (the `fast` extra)
    from orjson import loads as _orjson_loads
except ImportError:  # json.loads then (tests/convert/test_jsonl_fast_path.py compares the two)
    _orjson_loads = None

# Reject reasons (stable names: they appear in rejects.jsonl and the manifest).
INVALID_JSON = "invalid_json"
MISSING_FIELD = "missing_field"
NOT_A_STRING = "not_a_string"
INVALID_UTF8 = "invalid_utf8"
EMPTY_DOCUMENT = "empty_document"
REASONS = (INVALID_JSON, MISSING_FIELD, NOT_A_STRING, INVALID_UTF8, EMPTY_DOCUMENT)


@dataclass(frozen=True)
class Reject:
    record: int  # within the piece, from 1
    reason: str
    detail: str


class TextRun:
    """Consecutive records of a piece that are all good texts: their record numbers (a range)
    and their texts (see RangeReader.runs)."""

    __slots__ = ("numbers", "texts")

    def __init__(self, numbers: range, texts: list[str]):
        self.numbers = numbers
        self.texts = texts


_BLANK = object()  # a blank line: a separator, not a record


def _open_stream(file: InputFile, storage_options: dict | None):
    if is_local(file.path):
        if file.compression is not None:
            return open_decompressed(file.path, file.compression)
        return open(file.path, "rb")  # noqa: SIM115 (the caller closes it)
    raw = open_input(file, storage_options, STREAM_BLOCK)
    if file.compression is None:
        return raw
    return open_decompressed(file.path, file.compression, raw)


def _line_chunks(
    file: InputFile, piece: InputRange, storage_options: dict | None
) -> Iterator[list[bytes]]:
    """The raw lines of the piece, without their line terminator, in lists of about
    `_CHUNK_BYTES` (so what is made of a list's lines, their texts, stays that small)."""
    if file.compression is None:
        # One read of the whole piece (one range request for a remote file).
        data = read_input_range(file, piece.start, piece.end, storage_options)
        if len(data) < piece.end - piece.start:
            # The plan measured the file; a file that shrank since would lose records silently.
            raise DamagedInputError(
                file.path, piece.start + len(data), "the file ends early: it shrank during the run"
            )
        if data.endswith(b"\n"):
            data = data[:-1]
        if data:
            lines = data.split(b"\n")
            ends = list(itertools.accumulate(map(len, lines)))
            at = 0
            while at < len(lines):
                before = ends[at - 1] if at else 0
                stop = min(bisect.bisect_left(ends, before + _CHUNK_BYTES, at) + 1, len(lines))
                yield lines[at:stop]
                at = stop
        return
    with _open_stream(file, storage_options) as stream:
        chunk: list[bytes] = []
        size = 0
        for line in stream:
            chunk.append(line[:-1] if line.endswith(b"\n") else line)
            size += len(line)
            if size >= _CHUNK_BYTES:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk


_CHUNK_BYTES = 1 << 20


def _check_text(record: int, value, field: str) -> str | Reject:
    if value is None:
        return Reject(record, MISSING_FIELD, f"field {field!r} is null")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Reject(record, INVALID_UTF8, f"field {field!r}: {exc}")
    if not isinstance(value, str):
        return Reject(
            record, NOT_A_STRING, f"field {field!r} is a {type(value).__name__}, not a string"
        )
    if not value or value.isspace():  # `not value.strip()` without copying the text
        return Reject(record, EMPTY_DOCUMENT, f"field {field!r} is empty or only whitespace")
    try:
        value.encode("utf-8")  # JSON escapes can smuggle in lone surrogates the tokenizer rejects
    except UnicodeEncodeError as exc:
        return Reject(
            record, INVALID_UTF8, f"field {field!r}: {exc.reason} at character {exc.start}"
        )
    return value


def _fast_text(key_path: tuple[str, ...]):
    """A function: raw JSONL line -> its text, when orjson is installed; None otherwise.

    The function answers only for the common line (it parses, the key path leads through
    objects to a string that is not blank) and returns None for any other, which then takes
    json.loads and the checks above, so rejects keep their reasons and messages. That is
    exact because orjson accepts a subset of what json.loads accepts (it refuses NaN,
    Infinity, a byte-order mark, invalid UTF-8, and lone surrogates in escapes) and decodes
    the strings it accepts to the same str; and the string needs no UTF-8 check: without lone
    surrogates every str encodes."""
    if _orjson_loads is None:
        return None
    loads = _orjson_loads
    decode_error = ValueError  # orjson.JSONDecodeError subclasses it
    first, rest = key_path[0], key_path[1:]

    def text(raw: bytes) -> str | None:
        try:
            obj = loads(raw)
        except decode_error:
            return None
        if type(obj) is not dict:
            return None
        value = obj.get(first)
        for part in rest:
            if type(value) is not dict:
                return None
            value = value.get(part)
        if type(value) is not str or not value or value.isspace():
            return None
        return value

    return text


def _lookup(obj, key_path: tuple[str, ...]):
    """Follow a dotted key; returns (found, value)."""
    for part in key_path:
        if not isinstance(obj, dict) or part not in obj:
            return False, None
        obj = obj[part]
    return True, obj


def _split_runs(texts: list, slow, before: int) -> Iterator:
    """TextRuns of the stretches of `texts` that are not None (records before+1...), and for
    each None its record, slow(i), unless that is _BLANK (no record)."""
    start = 0
    while start < len(texts):
        try:
            stop = texts.index(None, start)
        except ValueError:
            stop = len(texts)
        if stop > start:
            yield TextRun(range(before + start + 1, before + stop + 1), texts[start:stop])
        if stop < len(texts):
            item = slow(stop)
            if item is not _BLANK:
                yield before + stop + 1, item
        start = stop + 1


class RangeReader:
    """Iterates (record number, text or Reject) over one piece; `.records` spans the piece.

    With `objects=True` (fine-tuning records) it yields each parsed JSON value or Parquet/Arrow
    row (a dict) instead of a text field; `fields` then limits the table columns read (None:
    all). `cache`: a worker's BlockCache, for pieces that are row ranges of a larger block.
    """

    def __init__(
        self,
        file: InputFile,
        piece: InputRange,
        text_key: str,
        txt_mode: str,
        *,
        objects: bool = False,
        fields: tuple[str, ...] | None = None,
        storage_options: dict | None = None,
        cache: BlockCache | None = None,
    ):
        self.storage_options = storage_options
        self.objects = objects
        self.fields = fields
        self.file = file
        self.piece = piece
        self.text_key = text_key
        self.key_path = tuple(text_key.split("."))
        self.txt_mode = txt_mode
        self.cache = cache
        self.records = 0  # lines/rows covered, blank lines included; valid after iteration

    def __iter__(self) -> Iterator[tuple[int, str | Reject]]:
        if self.file.kind == "parquet":
            yield from self._parquet()
        elif self.file.kind == "arrow":
            yield from self._arrow()
        elif self.file.kind == "txt" and self.txt_mode == "file":
            yield from self._txt_file()
        else:
            yield from self._line_records()

    def runs(self) -> Iterator[TextRun | tuple[int, str | Reject]]:
        """What iterating gives, except that each stretch of good text records (JSONL read
        with orjson, Parquet and Arrow) comes as one TextRun: the tokenizer takes them whole
        instead of a record at a time, which cost a worker ~1 µs of Python per record here
        and in its loop (2% of its time)."""
        kind = self.file.kind
        if self.objects or kind not in ("jsonl", "parquet", "arrow"):
            yield from self
        elif kind == "parquet":
            yield from self._parquet(runs=True)
        elif kind == "arrow":
            yield from self._arrow(runs=True)
        elif (fast := self._fast()) is None:
            yield from self
        else:
            number = 0  # lines before the chunk
            for chunk in _line_chunks(self.file, self.piece, self.storage_options):
                # orjson takes a trailing \r as whitespace, like the line without it; a blank
                # line fails to parse and goes the slow way, which passes over it.
                texts = list(map(fast, chunk))
                slow = functools.partial(self._nth_line, chunk, number)
                yield from _split_runs(texts, slow, number)
                number += len(chunk)
            self.records = number

    def _nth_line(self, chunk: list[bytes], before: int, i: int):
        return self._line_item(before + i + 1, chunk[i], None)

    def _fast(self):
        """_fast_text's function for this piece's text field, or None (not JSONL texts, or no
        orjson)."""
        if self.file.kind != "jsonl" or self.objects:
            return None
        return _fast_text(self.key_path)

    def _line_records(self) -> Iterator[tuple[int, str | Reject]]:
        fast = self._fast()
        number = 0
        for chunk in _line_chunks(self.file, self.piece, self.storage_options):
            for raw in chunk:
                number += 1
                item = self._line_item(number, raw, fast)
                if item is not _BLANK:
                    yield number, item
        self.records = number

    def _line_item(self, number: int, raw: bytes, fast):
        """Line `number`'s record: its text (its parsed value with `objects`), a Reject, or
        _BLANK for a blank line, which is no record. `fast`: _fast_text's function or None."""
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            return _BLANK
        if fast is not None:
            text = fast(raw)
            if text is not None:
                return text
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Reject(number, INVALID_UTF8, f"byte {exc.start} of the line: {exc.reason}")
        if self.file.kind != "jsonl":
            return _check_text(number, line, "line")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            return Reject(number, INVALID_JSON, exc.msg + f" at character {exc.pos}")
        if self.objects:
            return obj
        found, value = _lookup(obj, self.key_path)
        if not found:
            return Reject(number, MISSING_FIELD, f"no field {self.text_key!r}")
        return _check_text(number, value, self.text_key)

    def _txt_file(self) -> Iterator[tuple[int, str | Reject]]:
        with _open_stream(self.file, self.storage_options) as stream:
            data = stream.read()
        self.records = 1
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield 1, Reject(1, INVALID_UTF8, f"byte {exc.start} of the file: {exc.reason}")
            return
        yield 1, _check_text(1, text, "file")

    def _parquet(self, runs: bool = False) -> Iterator[tuple[int, str | Reject]]:
        local = is_local(self.file.path)
        opened = (
            contextlib.nullcontext() if local
            else open_input(self.file, self.storage_options, PARQUET_BLOCK)
        )  # fmt: skip
        with opened as raw:
            parquet = open_parquet(self.file.path, raw)
            yield from self._table_records(
                ParquetPiece(parquet, self.file, self.piece, self.cache), runs
            )

    def _arrow(self, runs: bool = False) -> Iterator[tuple[int, str | Reject]]:
        with open_input(self.file, self.storage_options, ARROW_SCAN_BLOCK) as f:
            table = ArrowPiece(f, self.file, self.piece, self.cache)
        yield from self._table_records(table, runs)

    def _table_records(self, table, runs: bool = False) -> Iterator:
        self.records = table.num_rows
        if self.objects:
            columns = None if self.fields is None else [n for n in table.names if n in self.fields]
            rows = table.read(columns).to_pylist()
            self._release(table)
            yield from enumerate(rows, start=1)
            return
        # A column literally named "a.b" wins over the nested path a -> b.
        if self.text_key in table.names:
            column, rest = self.text_key, ()
        else:
            column, rest = self.key_path[0], self.key_path[1:]
        if column not in table.names:
            self._release(table)
            for number in range(1, table.num_rows + 1):
                yield number, Reject(number, MISSING_FIELD, f"no column {column!r}")
            return
        values = table.read([column]).column(0).to_pylist()
        self._release(table)
        slow = functools.partial(self._nth_value, values, rest)
        if runs and not rest:
            # What _check_text accepts of a str: pyarrow's strings are valid UTF-8 (the block
            # was validated), so without lone surrogates; anything else goes the slow way.
            texts = [v if type(v) is str and v and not v.isspace() else None for v in values]
            yield from _split_runs(texts, slow, 0)
            return
        for i in range(len(values)):
            yield i + 1, slow(i)

    def _nth_value(self, values: list, rest: tuple[str, ...], i: int):
        found, value = _lookup(values[i], rest) if rest else (True, values[i])
        if not found:
            return Reject(i + 1, MISSING_FIELD, f"no field {self.text_key!r}")
        return _check_text(i + 1, value, self.text_key)

    def _release(self, table) -> None:
        """Keep a decoded block only while a later row range of it is still to come."""
        if self.cache is not None and not (self.piece.rows and table.stop < table.block_rows):
            self.cache.clear()
