"""Deterministic work units: the input cut into pieces that workers tokenize independently.

A piece is a whole file, a byte range of a plain JSONL/txt file that starts and ends on line
starts, or one Parquet row group. Consecutive pieces are grouped into units of about
``unit_size`` input bytes. The plan depends only on the input files and ``unit_size`` (never on
the worker count), and the documents come out in input order whatever the plan is, so the unit
size changes how work is split and resumed but never the output bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtok.convert.inputs import PARQUET_BLOCK, InputFile, open_input
from shardtok.storage.location import is_local

MIN_AUTO_UNIT = 256 << 10
MAX_AUTO_UNIT = 16 << 20
_SCAN_CHUNK = 64 << 10


@dataclass(frozen=True)
class InputRange:
    input_index: int  # position of the file in the discovered input list
    start: int = 0  # byte range [start, end) for splittable files; whole file otherwise
    end: int = 0
    row_group: int | None = None  # Parquet only

    def to_json(self) -> list:
        return [self.input_index, self.start, self.end, self.row_group]


@dataclass(frozen=True)
class Unit:
    index: int
    pieces: tuple[InputRange, ...]
    nbytes: int  # input bytes, for the progress bar's ETA


def auto_unit_size(total_bytes: int) -> int:
    """About 64 units for small corpora (so every core has work), 16 MiB each for large ones."""
    return max(MIN_AUTO_UNIT, min(MAX_AUTO_UNIT, total_bytes // 64))


def _next_line_start(f, target: int, end: int) -> int:
    """The first line start at or after `target` (a position just after a newline), or `end`."""
    if target >= end:
        return end
    f.seek(target - 1)
    pos = target - 1
    while pos < end:
        chunk = f.read(min(_SCAN_CHUNK, end - pos))
        if not chunk:
            return end
        hit = chunk.find(b"\n")
        if hit >= 0:
            return pos + hit + 1
        pos += len(chunk)
    return end


def _byte_range_pieces(
    index: int, file: InputFile, first_cut: int, unit_size: int, storage_options: dict | None
) -> list[InputRange]:
    pieces = []
    start = 0
    target = first_cut
    # Remote: no read-ahead, so finding each cut costs one small range request.
    with open_input(file, storage_options) as f:
        while start < file.size:
            cut = _next_line_start(f, max(target, start + 1), file.size)
            pieces.append(InputRange(index, start, cut))
            start, target = cut, cut + unit_size
    return pieces


def _parquet_pieces(
    index: int, file: InputFile, storage_options: dict | None
) -> list[tuple[InputRange, int]]:
    from shardtok.convert.compressed import open_parquet

    if is_local(file.path):
        meta = open_parquet(file.path).metadata
    else:
        with open_input(file, storage_options, PARQUET_BLOCK) as raw:
            meta = open_parquet(file.path, raw).metadata
    groups = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    total = sum(groups) or 1
    # Spread the file's real size over its row groups for the progress bar.
    return [(InputRange(index, row_group=i), file.size * g // total) for i, g in enumerate(groups)]


def plan_units(
    files: list[InputFile], unit_size: int, txt_mode: str, storage_options: dict | None = None
) -> list[Unit]:
    """Cut the inputs into pieces and group consecutive pieces into units of ~unit_size bytes.
    `storage_options` go to fsspec for remote inputs (the pieces are the same as for a local
    copy of the same bytes)."""
    units: list[Unit] = []
    current: list[InputRange] = []
    current_bytes = 0

    def flush() -> None:
        nonlocal current, current_bytes
        if current:
            units.append(Unit(len(units), tuple(current), current_bytes))
        current, current_bytes = [], 0

    def add(piece: InputRange, nbytes: int) -> None:
        nonlocal current_bytes
        current.append(piece)
        current_bytes += nbytes
        if current_bytes >= unit_size:
            flush()

    for index, file in enumerate(files):
        if file.kind == "parquet":
            for piece, nbytes in _parquet_pieces(index, file, storage_options):
                add(piece, nbytes)
        elif file.splittable and not (file.kind == "txt" and txt_mode == "file"):
            # The first piece fills what the open unit has left, so small files share units.
            first_cut = unit_size - current_bytes
            for piece in _byte_range_pieces(index, file, first_cut, unit_size, storage_options):
                add(piece, piece.end - piece.start)
        else:
            add(InputRange(index, 0, file.size), file.size)
    flush()
    return units
