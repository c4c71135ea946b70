"""The merge's tasks: what a worker process or an engine's task runs, one call per item.

Both are top-level functions over small frozen dataclasses (picklable under any start method, and
with nothing big in them: never the tokenizer, whose JSON is megabytes), and both return plain
JSON-like data. :func:`load_batch` reads and checks a batch of units' markers; :func:`write_shard`
writes one planned shard from its units' frames through shard_plan's writer and publishes it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from shardtok.convert.workdir import WorkDir
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
    None), ("damaged", why), ("failed", failure fields) or ("missing",)."""
    dtype = token_dtype(task.dtype)
    out = []
    for index, pieces in zip(task.indices, task.pieces):
        result = task.workdir.load_result(index, dtype, masks=task.masks, pieces=pieces)
        if isinstance(result, str):
            out.append(("damaged", result))
        elif result is not None:
            reframed = None
            frame_size, level = task.frame_settings
            if result.frame_settings != [frame_size, level]:
                tokens, docs = task.workdir.load_unit(index, dtype)
                reframed = encode_frames(tokens, docs[:, 2], frame_size, level)[0].tolist()
            out.append(("done", result.to_json().decode(), reframed))
        else:
            failure = task.workdir.load_failure(index, task.stop_at_bad_record, pieces)
            if failure is None:
                out.append(("missing",))
            else:
                out.append(("failed", type(failure).__name__, dataclasses.asdict(failure)))
    return out


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
    tokens, docs = task.workdir.load_unit(part.index, dtype)
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
        size = int(table[:, 2].sum())
        stored = memoryview(task.workdir.load_frames(part.index))[
            part.stored_at : part.stored_at + size
        ]
    masks = None
    if settings.masked:
        masks = check_mask(task.workdir.load_masks(part.index)[lo:hi], hi - lo)
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
    """Write one shard into the output folder; its manifest entry, as a dict."""
    file = task.settings.file(task.number)
    parts = ((_framed(task, part), 0, len(part.frames)) for part in task.parts)
    with task.folder.scratch() as scratch:
        entry = build_shard(task.settings, task.number, parts, scratch / file)
        task.folder.put_file(file, scratch / file)
    return dataclasses.asdict(entry)
