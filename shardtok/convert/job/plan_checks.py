"""Whether a plan's units tile its input files and its job name can prefix shard file names."""

from __future__ import annotations

import json

from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.units import Unit
from shardtok.format.shard_plan import shard_file_name
from shardtok.format.validate import is_plain_name


def name_problem(name: object) -> str | None:
    """Why `name` cannot prefix the shards' file names (None when it can): their names must be
    plain file names by the manifest's own rule, or the dataset could not be read back."""
    if not isinstance(name, str) or not name:
        return "must be a plain file name prefix, got an empty name"
    if not (is_plain_name(name) and is_plain_name(shard_file_name(name, 0))):
        return (
            f"must be a plain file name prefix ([A-Za-z0-9._-], not starting with '.', without "
            f"'..', short enough for NAME-000000.tar), got {short(name)}"
        )
    return None


def short(value) -> str:
    """`value` as JSON (or repr), cut to 60 characters to fit a one-line message."""
    text = json.dumps(value, ensure_ascii=False) if _jsonable(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def coverage_problem(
    units: tuple[Unit, ...], files: tuple[InputFile, ...], txt_mode: str
) -> tuple[str, str] | None:
    """Where and why the units' pieces fail to tile the inputs (None when they do). The pieces,
    in unit order, must take every input file in order, each part once: a unit dropped from the
    list, repeated or moved would otherwise lose, double or reorder documents in a dataset that
    verifies. Byte ranges must tile their file; row groups, record batches and row ranges must
    follow on (the plan cannot see how many rows a group has, so a Parquet or Arrow file's last
    pieces are the fingerprint's to vouch for)."""
    pieces = [(u.index, j, p) for u in units for j, p in enumerate(u.pieces)]
    by_file: list[list] = [[] for _ in files]
    last = -1
    for index, j, piece in pieces:
        if piece.input_index < last:
            return f"job.units[{index}] piece {j}", "takes an input file out of order"
        last = piece.input_index
        by_file[piece.input_index].append((index, j, piece))
    for number, (file, taken) in enumerate(zip(files, by_file)):
        if file.kind == "parquet":
            problem = _follows_on(taken, lambda p: (p.row_group,), lambda p, q: (
                p.row_group + 1 == q.row_group and q.start == q.end == 0
            ), first=lambda p: p.row_group == 0)  # fmt: skip
        elif file.kind == "arrow":
            problem = _follows_on(taken, lambda p: (p.start, p.end), lambda p, q: (
                p.end == q.start
            ), first=lambda p: True, empty=False)  # fmt: skip
        elif file.splittable and not (file.kind == "txt" and txt_mode == "file"):
            problem = _tiles(taken, file.size)
        elif [(p.start, p.end) for _, _, p in taken] != [(0, file.size)]:
            problem = "must be one piece of the whole file"
        else:
            problem = None
        if problem is not None:
            where, message = problem if isinstance(problem, tuple) else (None, problem)
            return where or f"job.inputs[{number}]", message
    return None


def _tiles(taken: list, size: int):
    """Why byte ranges `taken` do not cut [0, size) into consecutive non-empty ranges, or None."""
    at = 0
    for index, j, piece in taken:
        if piece.start != at or piece.end <= piece.start:
            whole = "its file's next range" if at else "its file's first range"
            return f"job.units[{index}] piece {j}", f"is not {whole} (from byte {at:,})"
        at = piece.end
    if at != size:
        return f"is not covered by the units (its last {size - at:,} bytes are in none)"
    return None


def _follows_on(taken: list, block, follows, first, empty=True):
    """Why blocks (row groups, record batch runs) `taken` do not follow on from one another,
    each whole or in row ranges from row 0, or None. `block(piece)`: the block's identity;
    `follows(p, q)`: whether block q comes right after block p; `first(p)`: whether p may open
    the file; `empty`: whether the file may have no pieces."""
    if not taken:
        return None if empty else "is not covered by the units"
    previous = None
    for index, j, piece in taken:
        where = f"job.units[{index}] piece {j}"
        if previous is not None and block(piece) == block(previous):
            ok = (
                previous.rows is not None
                and piece.rows is not None
                and piece.rows[0] == previous.rows[1]
            )
        else:
            ok = (piece.rows is None or piece.rows[0] == 0) and (
                first(piece) if previous is None else follows(previous, piece)
            )
        if not ok:
            return where, "does not follow on from the piece before it"
        previous = piece
    return None
