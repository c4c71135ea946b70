"""The merge's tasks: what a worker process or an engine's task runs, one call per item.

Both are top-level functions over small frozen dataclasses (picklable under any start method, and
with nothing big in them: never the tokenizer, whose JSON is megabytes), and both return plain
JSON-like data. :func:`load_batch` reads and checks a batch of units' markers; :func:`write_shard`
writes one planned shard from its units' frames through shard_plan's writer and publishes it.

Where the crc32s are checked: a unit's files are read whole to check them, on an object store a
download, and the shard tasks must read them anyway. So load_batch checks only the markers and
the files' sizes, and each shard task checks every unit file it loads on the bytes it holds (a
unit in two shards is checked twice); a unit load_batch re-encodes is checked there too. A task
that finds damage publishes nothing and returns it as data (see :func:`write_shard`), so the
driver can send the unit back to run-units before index.json is ever written.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np

from shardtok.convert.job.workdir import WorkDir, unit_base
from shardtok.format.mmidx import token_dtype
from shardtok.format.shard_plan import (
    FramedDocs,
    ShardSettings,
    build_shard,
    check_mask,
    encode_frames,
)
from shardtok.storage.folder import Folder


@dataclass(frozen=True)
class LoadBatch:
    workdir: WorkDir
    indices: tuple[int, ...]
    pieces: tuple[int, ...]  # each unit's piece count in the plan (its markers must agree)
    dtype: str
    masks: bool
    frame_settings: tuple[int, int | None]
    stop_at_bad_record: bool  # the job's mode: only failures recorded under it count


def load_batch(task: LoadBatch) -> list[tuple]:
    """Each unit's state: ("done", marker JSON, frame table re-made under other frame settings or
    None), ("damaged", why), ("failed", failure fields) or ("missing",). Only markers and sizes
    are checked, but for a re-encoded unit, whose tokens are read here anyway."""
    dtype = token_dtype(task.dtype)
    out = []
    for index, pieces in zip(task.indices, task.pieces):
        result = task.workdir.load_result(
            index, dtype, masks=task.masks, verify=False, pieces=pieces
        )
        if isinstance(result, str):
            out.append(("damaged", result))
        elif result is not None:
            reframed = None
            frame_size, level = task.frame_settings
            if result.frame_settings != [frame_size, level]:
                try:
                    reframed = reframed_table(task.workdir, result, dtype, frame_size, level)
                except _Damaged as damaged:
                    out.append(("damaged", damaged.why))
                    continue
            out.append(("done", result.to_json().decode(), reframed))
        else:
            failure = task.workdir.load_failure(index, task.stop_at_bad_record, pieces)
            if failure is None:
                out.append(("missing",))
            else:
                out.append(("failed", type(failure).__name__, dataclasses.asdict(failure)))
    return out


def reframed_table(workdir: WorkDir, result, dtype, frame_size: int, level: int | None) -> list:
    """The frame table of a unit persisted under other frame settings, under these (the shard
    task that writes its frames encodes them again, and checks they match)."""
    tokens, docs = _load_unit(workdir, result.index, dtype, result.checksums)
    return encode_frames(tokens, docs[:, 2], frame_size, level)[0].tolist()


class _Damaged(Exception):
    """A unit file whose bytes are not those its marker's crc32 vouches for."""

    def __init__(self, index: int, why: str):
        super().__init__(index, why)
        self.index, self.why = index, why


def _checked(index: int, checksums: dict, suffix: str, data):
    """`data` (a unit file's whole bytes) if they match the marker's crc32, else _Damaged."""
    if zlib.crc32(data) != checksums.get(suffix):
        raise _Damaged(index, f"{unit_base(index) + suffix} fails its crc32 check")
    return data


def _load_unit(workdir: WorkDir, index: int, dtype, checksums: dict):
    """(tokens, docs) of a unit, both files checked against its marker's crc32s."""
    tokens = _checked(index, checksums, ".tokens", workdir.load_tokens(index, dtype))
    data, docs = workdir.load_docs_bytes(index)
    _checked(index, checksums, ".docs.npy", data)
    return tokens, docs


def _check_table(index: int, table: np.ndarray, sizes: np.ndarray, tokens: np.ndarray) -> None:
    """The marker's frame table against the unit's checked tokens: each frame's documents,
    uncompressed size and crc32 (`table`: the part's rows, documents counted from the part's
    first). The shard's index takes the table as it is, so a marker damaged here (its own
    bytes have no checksum) would make a shard that fails verify; as _Damaged, the unit is
    sent back to run-units instead."""
    ends = np.cumsum(sizes) * tokens.itemsize
    raw = memoryview(np.ascontiguousarray(tokens)).cast("B")
    firsts = table[:, 0].tolist() + [len(sizes)]
    for number, (first, size, _, crc) in enumerate(table.tolist()):
        last = firsts[number + 1]
        if not 0 <= first < last <= len(sizes):
            why = "does not take the documents in order"
        else:
            lo = int(ends[first - 1]) if first else 0
            hi = int(ends[last - 1])
            if hi - lo != size:
                why = "does not match the tokens' sizes"
            elif zlib.crc32(raw[lo:hi]) != crc:
                why = "lists a crc32 its frame's tokens do not have"
            else:
                continue
        raise _Damaged(index, f"{unit_base(index)}.json's frame table {why} (frame {number})")


@dataclass(frozen=True)
class UnitPart:
    """Frames of one unit that go into one shard."""

    index: int
    frames: tuple[tuple[int, int, int, int], ...]  # their table rows (documents from the unit's 0)
    stored_at: int  # where the first one starts in the unit's .frames file
    doc_end: int  # the unit's document after the last frame's last
    paths: tuple[str, ...]  # input path of each of the unit's pieces
    bases: tuple[int, ...]  # record base of each piece (see RecordAccounting)
    reframe: bool  # the unit's frames were made under other settings: encode them here
    checksums: tuple[tuple[str, int], ...]  # the marker's crc32 of each unit file, by suffix


@dataclass(frozen=True)
class ShardTask:
    folder: Folder
    workdir: WorkDir
    settings: ShardSettings
    number: int
    parts: tuple[UnitPart, ...]


def _framed(task: ShardTask, part: UnitPart) -> FramedDocs:
    settings = task.settings
    dtype = token_dtype(settings.dtype)
    checksums = dict(part.checksums)
    tokens, docs = _load_unit(task.workdir, part.index, dtype, checksums)
    table = np.asarray(part.frames, dtype=np.int64).reshape(-1, 4)
    first_doc, end_doc = int(table[0, 0]), part.doc_end
    table[:, 0] -= first_doc
    sizes = docs[first_doc:end_doc, 2]
    lo = int(docs[:first_doc, 2].sum())
    hi = lo + int(sizes.sum())
    if part.reframe:
        again, stored = encode_frames(
            tokens[lo:hi], sizes, settings.frame_size, settings.compression_level
        )
        if not np.array_equal(again, table):
            raise AssertionError(f"unit {part.index}: re-encoded frames differ from the plan")
    else:
        _check_table(part.index, table, sizes, tokens[lo:hi])
        size = int(table[:, 2].sum())
        frames = _checked(part.index, checksums, ".frames", task.workdir.load_frames(part.index))
        stored = memoryview(frames)[part.stored_at : part.stored_at + size]
    masks = None
    if settings.masked:
        all_masks = _checked(part.index, checksums, ".mask", task.workdir.load_masks(part.index))
        masks = check_mask(all_masks[lo:hi], hi - lo)
    rows = docs[first_doc:end_doc]
    records = np.asarray(part.bases, dtype=np.int64)[rows[:, 0]] + rows[:, 1]
    return FramedDocs.checked(
        tokens[lo:hi],
        sizes,
        table,
        stored,
        dtype,
        settings.vocab_size,
        (list(part.paths), rows[:, 0], records),
        masks,
    )


def write_shard(task: ShardTask) -> dict:
    """Write one shard into the output folder; its manifest entry, as a dict. When unit files
    fail their crc32 the shard is not published and the answer is {"damaged": [[unit index,
    why], ...]} (every damaged unit of the shard): data, not an exception, so the driver hears
    from every task before it raises."""
    file = task.settings.file(task.number)
    parts = ((_framed(task, part), 0, len(part.frames)) for part in task.parts)
    with task.folder.scratch() as scratch:
        try:
            entry = build_shard(task.settings, task.number, parts, scratch / file)
        except _Damaged as first:  # the half-built shard goes with the scratch folder
            found = [first]
            at = [part.index for part in task.parts].index(first.index)
            for part in task.parts[at + 1 :]:  # the others damaged too, for the message
                try:
                    _framed(task, part)
                except _Damaged as damaged:
                    found.append(damaged)
            return {"damaged": [[damaged.index, damaged.why] for damaged in found]}
        task.folder.put_file(file, scratch / file)
    return dataclasses.asdict(entry)
