"""Parquet and Arrow pieces as tables: a row group, a run of record batches, or a row range of
one of them, decoded and fully validated.

pyarrow reads no less than a whole row group (or record batch), so a block cut into row ranges
is decoded once per worker and kept for its next range (:class:`BlockCache`), not once per unit.
records.RangeReader reads a piece's rows through these.
"""

from __future__ import annotations

from shardtok.convert.inputs.compressed import DamagedInputError
from shardtok.convert.inputs.files import InputError, InputFile
from shardtok.convert.inputs.units import InputRange


class BlockCache:
    """The last row group or record batch a worker decoded for a row range, kept while a later
    range of it may come to the same worker. At most one block is held, and a new one is only
    loaded after the old one is let go."""

    def __init__(self):
        self.key = None
        self.table = None

    def get(self, key, load):
        if key != self.key:
            self.clear()
            self.table, self.key = load(), key
        return self.table

    def clear(self) -> None:
        self.key = self.table = None


def _identity(file: InputFile) -> tuple:
    return (file.path, file.size, file.mtime_ns, file.etag)


def _checked(path: str, offset: int | None, problem: str, load):
    """The table `load()` decodes, fully validated: pyarrow trusts a block's offsets and UTF-8,
    and turning a damaged one into Python strings fails in odd ways or crashes the worker."""
    import pyarrow as pa  # optional dependency: only needed for Parquet and Arrow inputs

    try:
        table = load()
        table.validate(full=True)
    except OSError as exc:
        if exc.errno is not None:  # a real I/O error (permissions...), not pyarrow's verdict
            raise
        raise DamagedInputError(path, offset, f"{problem}: {exc}") from None
    except (pa.ArrowException, UnicodeDecodeError) as exc:  # the latter: a field's name
        raise DamagedInputError(path, offset, f"{problem}: {exc}") from None
    return table


def _row_range(file: InputFile, piece: InputRange, block_rows: int, block: str) -> tuple[int, int]:
    """The rows [first, stop) `piece` takes of a block of `block_rows` rows (all without rows)."""
    first, stop = piece.rows or (0, block_rows)
    if stop > block_rows:
        raise InputError(
            f"{file.path}: the plan names rows {first}..{stop} of {block}, which has "
            f"{block_rows}: it changed since the conversion was planned"
        )
    return first, stop


class ParquetPiece:
    """A piece of a Parquet file: a row group, or a row range of one."""

    def __init__(self, parquet, file: InputFile, piece: InputRange, cache: BlockCache | None):
        self.parquet, self.file, self.piece, self.cache = parquet, file, piece, cache
        self.names = parquet.schema_arrow.names
        meta = parquet.metadata
        group = piece.row_group
        if group is None or not 0 <= group < meta.num_row_groups:
            raise InputError(
                f"{file.path}: the plan names row group {group}, the file has "
                f"{meta.num_row_groups}: it changed since the conversion was planned"
            )
        self.block_rows = meta.row_group(group).num_rows
        self.first, self.stop = _row_range(file, piece, self.block_rows, f"row group {group}")
        self.num_rows = self.stop - self.first

    def read(self, columns: list[str] | None):
        group = self.piece.row_group

        def load():
            read = lambda: self.parquet.read_row_group(group, columns=columns)  # noqa: E731
            return _checked(self.file.path, None, f"row group {group} does not decode", read)

        if self.piece.rows is None:
            return load()
        key = (_identity(self.file), group, None if columns is None else tuple(columns))
        table = load() if self.cache is None else self.cache.get(key, load)
        return table.slice(self.first, self.num_rows)


class ArrowPiece:
    """A piece of an Arrow IPC file: a run of record batches, or a row range of one batch."""

    def __init__(self, f, file: InputFile, piece: InputRange, cache: BlockCache | None):
        from shardtok.convert.inputs.arrow_ipc import decode, head_of

        self.file, self.piece = file, piece

        def load():
            head_start, head_end = head_of(f, file.size, file.path)
            f.seek(head_start)
            head = f.read(head_end - head_start)
            f.seek(piece.start)
            body = f.read(piece.end - piece.start)
            if len(head) < head_end - head_start or len(body) < piece.end - piece.start:
                raise DamagedInputError(
                    file.path, None, "the file ends early: it shrank during the run"
                )
            problem = "the record batches from here do not decode"
            return _checked(file.path, piece.start, problem, lambda: decode(head, body))

        if piece.rows is None or cache is None:
            self.table = load()
        else:
            self.table = cache.get((_identity(file), piece.start, piece.end), load)
        self.names = self.table.schema.names
        self.block_rows = self.table.num_rows
        block = f"the record batch at byte {piece.start}"
        self.first, self.stop = _row_range(file, piece, self.block_rows, block)
        self.num_rows = self.stop - self.first

    def read(self, columns: list[str] | None):
        table = self.table if columns is None else self.table.select(columns)
        return table if self.piece.rows is None else table.slice(self.first, self.num_rows)
