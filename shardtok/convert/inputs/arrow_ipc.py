"""Arrow IPC files (``.arrow``, stream or file format) as record batches with byte ranges.

Hugging Face `datasets` writes its save_to_disk shards in the IPC *stream* format: a schema
message, record-batch messages, an end-of-stream marker. The IPC *file* format
(``pyarrow.ipc.new_file``) is the same stream between an 8-byte magic and a footer. To cut a file
into work units without reading it, the planner walks the messages' headers only: each message
is a length-prefixed flatbuffer whose ``bodyLength`` says where the next one starts, and a record
batch's header holds its row count. No body is read, so planning a remote file costs one small
range request per message.

A worker decodes its piece by handing pyarrow the file's head (schema and dictionaries) followed
by the piece's own record-batch messages and an end-of-stream marker: a stream of its own. A file
whose dictionaries change after its first record batch (delta or replacement dictionaries) is
read as one piece, since its batches cannot be decoded apart.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from shardtok.convert.inputs.compressed import DamagedInputError

FILE_MAGIC = b"ARROW1"
STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_CONTINUATION = 0xFFFFFFFF
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3
_KNOWN = (_SCHEMA, _DICTIONARY, _RECORD_BATCH)
_MAX_METADATA = 64 << 20  # a header larger than this is not a header


@dataclass(frozen=True)
class Batch:
    start: int  # where the record batch's message starts
    end: int  # where its body ends
    rows: int


@dataclass(frozen=True)
class ArrowLayout:
    head_end: int  # where the first record batch starts (schema and dictionaries lie before)
    batches: tuple[Batch, ...]
    splittable: bool  # False when a dictionary message follows the first record batch


class _Malformed(Exception):
    pass


class _Flatbuffer:
    """Bounds-checked reads of the few flatbuffer fields an IPC message header needs."""

    def __init__(self, data: bytes):
        self.data = data

    def _unpack(self, fmt: str, pos: int):
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            raise _Malformed("the message header points outside itself")
        return struct.unpack_from(fmt, self.data, pos)[0]

    def table(self, pos: int) -> int:
        """The table that the uoffset at `pos` points to."""
        return pos + self._unpack("<I", pos)

    def field(self, table: int, index: int) -> int | None:
        """Where field `index` of `table` lies, or None when it is absent (default value)."""
        vtable = table - self._unpack("<i", table)
        vtable_size = self._unpack("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > vtable_size:
            return None
        offset = self._unpack("<H", vtable + slot)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str) -> int:
        pos = self.field(table, index)
        return 0 if pos is None else self._unpack(fmt, pos)


def _parse_header(metadata: bytes) -> tuple[int, int, int]:
    """(header type, body length, rows) of a Message flatbuffer (Arrow's Message.fbs: fields
    version, header_type, header, bodyLength; a RecordBatch's first field is its length)."""
    fb = _Flatbuffer(metadata)
    message = fb.table(0)
    kind = fb.scalar(message, 1, "<B")
    body = fb.scalar(message, 3, "<q")
    rows = 0
    if kind == _RECORD_BATCH:
        at = fb.field(message, 2)
        if at is None:
            raise _Malformed("a record batch message without its header")
        rows = fb.scalar(fb.table(at), 0, "<q")
    if body < 0 or rows < 0:
        raise _Malformed("a negative body length or row count")
    return kind, body, rows


def _read_exactly(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _message(f, offset: int, limit: int, path: str) -> tuple[int, int, int] | None:
    """(header type, rows, end) of the message at `offset`: type 0 for an end-of-stream marker
    (`end` just after it); None when the stream ends at `limit` without one."""
    if offset == limit:
        return None
    head = _read_exactly(f, offset, 8)
    if len(head) < 4:
        raise DamagedInputError(path, offset, "the file ends inside an Arrow IPC message header")
    (first,) = struct.unpack_from("<I", head)
    if first == _CONTINUATION:
        if len(head) < 8:
            raise DamagedInputError(
                path, offset, "the file ends inside an Arrow IPC message header"
            )
        (length,) = struct.unpack_from("<i", head, 4)
        metadata_start = offset + 8
    else:  # the format before Arrow 0.15: no continuation marker
        length, metadata_start = struct.unpack_from("<i", head)[0], offset + 4
    if length == 0:
        return 0, 0, metadata_start
    if length < 0 or length > _MAX_METADATA or metadata_start + length > limit:
        raise DamagedInputError(
            path, offset, "not an Arrow IPC message (its header length is out of range)"
        )
    metadata = _read_exactly(f, metadata_start, length)
    if len(metadata) < length:
        raise DamagedInputError(path, offset, "the file ends inside an Arrow IPC message header")
    try:
        kind, body, rows = _parse_header(metadata)
    except _Malformed as exc:
        raise DamagedInputError(path, offset, f"not an Arrow IPC message ({exc})") from None
    if kind == 0:
        raise DamagedInputError(path, offset, "not an Arrow IPC message (no header type)")
    end = metadata_start + length + body
    if end > limit:
        raise DamagedInputError(
            path, offset, "the file ends inside the Arrow IPC message that starts here (cut short)"
        )
    return kind, rows, end


def _stream_bounds(f, size: int, path: str) -> tuple[int, int]:
    """(start, limit) of the message stream: the whole file for the stream format; between the
    magic and the footer for the file format."""
    magic = _read_exactly(f, 0, 8)
    if not magic.startswith(FILE_MAGIC):
        return 0, size
    tail = _read_exactly(f, size - 10, 10) if size >= 18 else b""
    if len(tail) < 10 or tail[4:] != FILE_MAGIC:
        raise DamagedInputError(
            path, size, "an Arrow IPC file without its footer (cut short, or not Arrow)"
        )
    footer = struct.unpack_from("<i", tail)[0]
    limit = size - 10 - footer
    if footer <= 0 or limit < 8:
        raise DamagedInputError(path, size - 10, "an Arrow IPC file whose footer is out of range")
    return 8, limit


def scan(f, size: int, path: str) -> ArrowLayout:
    """The layout of the Arrow IPC file open as `f` (seekable, binary) of `size` bytes; a
    DamagedInputError naming the byte offset when its messages do not add up."""
    start, limit = _stream_bounds(f, size, path)
    offset, head_end = start, None
    batches: list[Batch] = []
    splittable = True
    while True:
        found = _message(f, offset, limit, path)
        if found is None:
            if start == 0:
                # Writers end a stream with the marker; without it, a file cut between two
                # batches would lose the rows after the cut unseen. (The file format has its
                # footer for that.)
                raise DamagedInputError(
                    path, offset, "the Arrow IPC stream ends without its end-of-stream marker "
                    "(cut short?)"
                )  # fmt: skip
            break
        kind, rows, end = found
        if kind == 0:
            if offset == start:
                raise DamagedInputError(path, offset, "an empty Arrow IPC stream (no schema)")
            if start == 0 and end != size:
                # A stream file ends with its end-of-stream marker: more would be dropped unread.
                raise DamagedInputError(path, end, "bytes after the end of the Arrow IPC stream")
            break
        if (offset == start) != (kind == _SCHEMA):
            problem = "does not start with a schema" if offset == start else "has a second schema"
            raise DamagedInputError(path, offset, f"the Arrow IPC stream {problem}")
        if kind not in _KNOWN:
            raise DamagedInputError(
                path, offset, f"an Arrow IPC message of type {kind} (tensors are not tables)"
            )
        if kind == _RECORD_BATCH:
            head_end = offset if head_end is None else head_end
            batches.append(Batch(offset, end, rows))
        elif kind == _DICTIONARY and head_end is not None:
            splittable = False
        offset = end
    if offset == start:
        raise DamagedInputError(path, offset, "not an Arrow IPC stream (no schema)")
    return ArrowLayout(offset if head_end is None else head_end, tuple(batches), splittable)


def head_of(f, size: int, path: str) -> tuple[int, int]:
    """(start, end) of the file's head: the schema and the dictionaries before its first record
    batch (what a piece's batches need to be decoded), read without scanning further."""
    start, limit = _stream_bounds(f, size, path)
    offset = start
    while True:
        found = _message(f, offset, limit, path)
        if found is None or found[0] in (0, _RECORD_BATCH):
            return start, offset
        offset = found[2]


def decode(head: bytes, body: bytes):
    """The pyarrow Table of the record-batch messages `body`, decoded with the file's `head`."""
    import pyarrow as pa  # optional dependency: only needed for Arrow inputs

    buffer = pa.py_buffer(b"".join((head, body, STREAM_END)))
    with pa.ipc.open_stream(buffer) as reader:
        return reader.read_all()
