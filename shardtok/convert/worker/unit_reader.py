"""Reading a work unit's records inside a worker: as the tokenizing thread goes, or ahead.

Reading and parsing a unit (~8% of a worker's tokenizing thread for JSONL: the read, the line
split, orjson) needs the GIL, and the tokenizing thread spends most of a unit in tiktoken, which
releases it. So a worker of our pool reads its next unit on its writer thread while the
tokenizing thread encodes the current one (:class:`ReadAhead`; for a remote input the range
request's latency is hidden too). Nothing but the order of work changes: the records, rejects,
errors and their order are what reading in place gives, and an error found ahead is raised
where the tokenizing thread reaches it (tested).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from shardtok.convert.inputs.files import InputError
from shardtok.convert.inputs.records import RangeReader
from shardtok.convert.inputs.table_pieces import BlockCache
from shardtok.convert.inputs.units import MAX_AUTO_UNIT, Unit
from shardtok.convert.job.spec import WorkerConfig


def guarded(entries, path: str):
    """Turn a damaged input (truncated .gz, corrupt .zst or .parquet) into an error naming the file."""
    try:
        yield from entries
    except (OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the input: {exc}") from None
    except Exception as exc:  # zstandard.ZstdError, pyarrow.ArrowInvalid and kin
        if type(exc).__module__.split(".")[0] in ("zstandard", "pyarrow", "gzip"):
            raise InputError(f"{path}: cannot read the input: {exc}") from None
        raise


class PieceReader:
    """One piece of a unit, read in place: iterate it, then `records` is valid."""

    def __init__(self, config: WorkerConfig, piece, objects: bool, fields, blocks: BlockCache):
        """`config`: the worker's WorkerConfig; `objects`, `fields`: RangeReader's (fine-tuning
        records: whole objects, `fields` of them, or all of them for None; else texts)."""
        file = config.files[piece.input_index]
        self._reader = RangeReader(
            file, piece, config.job.text_key, config.job.txt_mode,
            objects=objects, fields=fields,
            storage_options=config.storage_options, cache=blocks,
        )  # fmt: skip
        source = self._reader if objects else self._reader.runs()
        self._entries = guarded(source, file.path)

    def __iter__(self) -> Iterator:
        return self._entries

    @property
    def records(self) -> int:
        return self._reader.records


class _ReadPiece:
    """A piece read ahead: its entries replayed, then the error that stopped it, if any."""

    def __init__(self, entries: list, records: int, error: BaseException | None):
        self._entries = entries
        self.records = records
        self._error = error

    def __iter__(self) -> Iterator:
        yield from self._entries
        if self._error is not None:
            raise self._error


# A unit read ahead is held whole until it is tokenized, where reading in place streams it
# in ~1 MiB of lines: only units of at most this many bytes of plain JSONL or text are (every
# unit convert plans by itself: MAX_AUTO_UNIT). A compressed file is one piece whatever its
# size, and a Parquet or Arrow block is decoded by pyarrow, which holds no GIL: read in place.
MAX_AHEAD_BYTES = MAX_AUTO_UNIT


def reads_ahead(unit: Unit, files) -> bool:
    """Whether `unit` (pieces of `files`) is read ahead when it can be."""
    if unit.nbytes > MAX_AHEAD_BYTES:
        return False
    for piece in unit.pieces:
        file = files[piece.input_index]
        if file.compression is not None or file.kind not in ("jsonl", "txt"):
            return False
    return True


class ReadAhead:
    """A unit's pieces, read on the worker's writer thread (:meth:`run`, submitted there) or,
    if that thread has not started on them when the tokenizing thread wants them, by the
    tokenizing thread itself (:meth:`take` then returns None): it never waits for the writer
    thread's queue, only for a read already under way."""

    def __init__(self, unit: Unit, config: WorkerConfig, objects: bool, fields, blocks: BlockCache):
        self._args = (unit, config, objects, fields, blocks)
        self._lock = threading.Lock()
        self._state = "queued"  # -> "reading" (the writer thread) or "taken" (the tokenizer)
        self._done = threading.Event()
        self._pieces: list[_ReadPiece] | None = None

    def run(self) -> None:
        """The writer thread's job. Never raises: an error met reading is the unit's, raised
        where its tokenizing reaches it; any other leaves the unit to be read in place."""
        with self._lock:
            if self._state != "queued":
                return
            self._state = "reading"
        try:
            pieces: list[_ReadPiece] = []
            unit, config, objects, fields, blocks = self._args
            for piece in unit.pieces:
                entries: list = []
                reader = None
                try:
                    reader = PieceReader(config, piece, objects, fields, blocks)
                    entries.extend(reader)
                except BaseException as exc:  # the unit's, to be raised where it is reached
                    records = reader.records if reader is not None else 0
                    pieces.append(_ReadPiece(entries, records, exc))
                    break  # a unit stops at its first error, as when read in place
                pieces.append(_ReadPiece(entries, reader.records, None))
            self._pieces = pieces
        except BaseException:  # not reading's (memory, say): take() gives None
            self._pieces = None
        finally:
            self._done.set()

    def take(self) -> list[_ReadPiece] | None:
        """The pieces read ahead (waiting for a read under way), or None where the reading had
        not started (or failed for a reason not the input's): it is the caller's now. A piece
        after one that stopped at an error is not in the list (reading never gets past that
        error)."""
        with self._lock:
            if self._state == "queued":
                self._state = "taken"
                return None
        self._done.wait()
        return self._pieces
