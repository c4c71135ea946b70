"""Deterministic work units: the input cut into pieces that workers tokenize independently.

A piece is a whole file, a byte range of a plain JSONL/txt file that starts and ends on line
starts, a Parquet row group, or a run of consecutive record batches of an Arrow IPC file. A row
group or record batch larger than a unit is cut into row ranges, so that workers share it.
Consecutive pieces are grouped into units of about ``unit_size`` input bytes. The plan depends
only on the input files and ``unit_size`` (never on the worker count), and the documents come out
in input order whatever the plan is, so the unit size changes how work is split and resumed but
never the documents or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardtok.convert.inputs.files import ARROW_SCAN_BLOCK, PARQUET_BLOCK, InputFile, open_input
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
    # Rows [first, stop) of the one row group (Parquet) or record batch (Arrow: start..end is
    # that batch's message) the piece takes; None: all of them.
    rows: tuple[int, int] | None = None

    def to_json(self) -> list:
        return [
            self.input_index,
            self.start,
            self.end,
            self.row_group,
            None if self.rows is None else list(self.rows),
        ]


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


class _Packer:
    """Groups consecutive pieces into units: a unit closes once it holds `unit_size` bytes."""

    def __init__(self, unit_size: int):
        self.unit_size = unit_size
        self.units: list[Unit] = []
        self.current: list[InputRange] = []
        self.current_bytes = 0

    @property
    def room(self) -> int:
        """Bytes the open unit takes before it closes (always > 0)."""
        return self.unit_size - self.current_bytes

    def add(self, piece: InputRange, nbytes: int) -> None:
        self.current.append(piece)
        self.current_bytes += nbytes
        if self.current_bytes >= self.unit_size:
            self.flush()

    def flush(self) -> None:
        if self.current:
            self.units.append(Unit(len(self.units), tuple(self.current), self.current_bytes))
        self.current, self.current_bytes = [], 0


def _row_ranges(rows: int, nbytes: int, room: int, unit_size: int) -> list[tuple[int, int, int]]:
    """Rows [a, b) of a block of `rows` rows and `nbytes` bytes, with their share of the bytes:
    the first range fills `room`, each later one `unit_size` (rows are assumed to be of equal
    size: the plan cannot see them). Like line-aligned byte ranges, each range reaches its
    target, so it closes its unit, and the next target counts from where it really ended."""

    def share(row: int) -> int:
        return nbytes * row // rows

    ranges = []
    first, target = 0, room
    while first < rows:
        stop = min(rows, max(first + 1, -(-rows * target // nbytes)))
        ranges.append((first, stop, share(stop) - share(first)))
        first, target = stop, share(stop) + unit_size
    return ranges


def _add_block(packer: _Packer, piece: InputRange, rows: int, nbytes: int) -> None:
    """A row group or record batch: whole when it fits in a unit, else cut into row ranges."""
    if rows < 2 or nbytes <= packer.unit_size:
        packer.add(piece, nbytes)
        return
    for first, stop, share in _row_ranges(rows, nbytes, packer.room, packer.unit_size):
        packer.add(replace(piece, rows=(first, stop)), share)


def _parquet_pieces(
    packer: _Packer, index: int, file: InputFile, storage_options: dict | None
) -> None:
    from shardtok.convert.inputs.compressed import open_parquet

    if is_local(file.path):
        meta = open_parquet(file.path).metadata
    else:
        with open_input(file, storage_options, PARQUET_BLOCK) as raw:
            meta = open_parquet(file.path, raw).metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    total = sum(g.total_byte_size for g in groups) or 1
    for i, group in enumerate(groups):
        # Spread the file's real size over its row groups (for the unit size and progress bar).
        nbytes = file.size * group.total_byte_size // total
        _add_block(packer, InputRange(index, row_group=i), group.num_rows, nbytes)


def _arrow_pieces(
    packer: _Packer, index: int, file: InputFile, storage_options: dict | None
) -> None:
    """Runs of whole record batches of about a unit each, a batch larger than a unit in row
    ranges. Each batch's bytes reach to the next one's start (the file's head goes with the
    first, its end-of-stream marker and footer with the last), so the pieces add up to the file.
    """
    from shardtok.convert.inputs.arrow_ipc import scan

    with open_input(file, storage_options, ARROW_SCAN_BLOCK) as f:
        layout = scan(f, file.size, file.path)
    batches = layout.batches
    if not batches or not layout.splittable:
        end = batches[-1].end if batches else layout.head_end
        packer.add(InputRange(index, layout.head_end, end), file.size)
        return
    bounds = [0] + [b.start for b in batches[1:]] + [file.size]
    run_start, run_end, run_bytes = None, 0, 0

    def close_run() -> None:
        nonlocal run_start, run_bytes
        if run_start is not None:
            packer.add(InputRange(index, run_start, run_end), run_bytes)
        run_start, run_bytes = None, 0

    for i, batch in enumerate(batches):
        nbytes = bounds[i + 1] - bounds[i]
        if nbytes > packer.unit_size and batch.rows >= 2:
            close_run()
            _add_block(packer, InputRange(index, batch.start, batch.end), batch.rows, nbytes)
            continue
        run_start = batch.start if run_start is None else run_start
        run_end, run_bytes = batch.end, run_bytes + nbytes
        if run_bytes >= packer.room:
            close_run()
    close_run()


def plan_units(
    files: list[InputFile], unit_size: int, txt_mode: str, storage_options: dict | None = None
) -> list[Unit]:
    """Cut the inputs into pieces and group consecutive pieces into units of ~unit_size bytes.
    `storage_options` go to fsspec for remote inputs (the pieces are the same as for a local
    copy of the same bytes)."""
    packer = _Packer(unit_size)
    for index, file in enumerate(files):
        if file.kind == "parquet":
            _parquet_pieces(packer, index, file, storage_options)
        elif file.kind == "arrow":
            _arrow_pieces(packer, index, file, storage_options)
        elif file.splittable and not (file.kind == "txt" and txt_mode == "file"):
            # The first piece fills what the open unit has left, so small files share units.
            first_cut = packer.room
            for piece in _byte_range_pieces(index, file, first_cut, unit_size, storage_options):
                packer.add(piece, piece.end - piece.start)
        else:
            packer.add(InputRange(index, 0, file.size), file.size)
    packer.flush()
    return packer.units
