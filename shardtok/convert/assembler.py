"""The main process's half of a conversion: finished units to shards, in unit order.

Units arrive in any order from the workers; the runner hands them here in input order, so the
DatasetWriter sees the same documents, frames (and, for SFT, masks) whatever the worker count.
The assembler also keeps the record accounting (read = written + rejected) and turns a unit's
first bad record into the error naming file and line.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardtok.convert.inputs import InputFile
from shardtok.convert.output_dir import RejectsFile
from shardtok.convert.units import Unit
from shardtok.convert.workdir import UnitResult, WorkDir
from shardtok.convert.worker import EncoderMismatch, UnitFailure
from shardtok.errors import BadRecordError, TokenizerMismatchError
from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.frames import FrameBuilder

_SFT_COUNTS = ("trained_tokens", "boundary_tokens", "truncated_records")


def rewrite_note(pattern: str, rewrite: str) -> str:
    return (
        f"note: jq pattern {pattern!r} cannot index a list in jq (Cannot index array with ...); "
        f"records where it fails use {rewrite!r}, which selects each element"
    )


class Assembler:
    """Feeds finished units to the DatasetWriter in unit order and keeps the record accounting.

    `note` prints a one-line note (once per distinct note) without breaking the progress bar.
    """

    def __init__(
        self,
        opts,
        files: list[InputFile],
        units: list[Unit],
        workdir: WorkDir,
        note: Callable[[str], None],
    ):
        self.opts = opts
        self.files = files
        self.units = units
        self.workdir = workdir
        self.note = note
        self.dtype = opts.tokenizer.dtype
        self.sft = opts.sft
        self.writer = DatasetWriter(
            opts.output,
            vocab_size=opts.tokenizer.vocab_size,
            tokenizer=opts.tokenizer.as_metadata(),
            name=opts.name,
            shard_size=opts.shard_size,
            compression_level=opts.compression_level,
            frame_size=opts.frame_size,
            masks=self.sft is not None,
            sft=None if self.sft is None else self.sft.metadata,
        )
        self.rejects = RejectsFile(Path(opts.output)) if opts.on_bad_record == "skip" else None
        self.records_seen = [0] * len(files)  # lines/rows of each file consumed so far
        self.records_read = 0
        self.documents = 0
        self.rejected: dict[str, int] = {}
        self.sft_counts = dict.fromkeys(_SFT_COUNTS, 0)
        self._noted: set[str] = set()

    def add(self, result: UnitResult | UnitFailure | EncoderMismatch) -> None:
        unit = self.units[result.index]
        bases = []
        for piece_no, piece in enumerate(unit.pieces):
            bases.append(self.records_seen[piece.input_index])
            if isinstance(result, UnitResult):
                self.records_seen[piece.input_index] += result.piece_records[piece_no]
        if isinstance(result, UnitFailure):
            self._raise(unit, bases, result.piece, result.record, result.reason, result.detail)
        if isinstance(result, EncoderMismatch):
            path = self.files[unit.pieces[result.piece].input_index].path
            raise TokenizerMismatchError(
                path,
                bases[result.piece] + result.record,
                f"tiktoken and tokenizers encode this document differently: {result.detail}; "
                "convert with --tokenizer-backend hf",
            )
        self._sft_stats(result)
        for piece_no, record, reason, detail in result.rejects:
            if self.rejects is None:
                self._raise(unit, bases, piece_no, record, reason, detail)
            path = self.files[unit.pieces[piece_no].input_index].path
            self.rejects.write(path, bases[piece_no] + record, reason, detail)
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
        tokens, docs = self.workdir.load_unit(result.index, self.dtype)
        masks = None if self.sft is None else self.workdir.load_masks(result.index)
        if result.frame_settings == [self.opts.frame_size, self.opts.compression_level]:
            frames, stored = result.frames, self.workdir.load_frames(result.index)
        else:  # persisted by a run with other --frame-size/--compression-level: re-encode
            buffer = io.BytesIO()
            framer = FrameBuilder(self.opts.frame_size, self.opts.compression_level, buffer)
            framer.add(tokens, docs[:, 2])
            frames, stored = framer.finish(), buffer.getbuffer()
        paths = [self.files[p.input_index].path for p in unit.pieces]
        records = np.asarray(bases, dtype=np.int64)[docs[:, 0]] + docs[:, 1]
        self.writer.add_frames(
            tokens,
            docs[:, 2],
            frames,
            stored,
            provenance=(paths, docs[:, 0], records),
            masks=masks,
        )
        self.records_read += result.records_read
        self.documents += result.num_documents

    def _sft_stats(self, result: UnitResult) -> None:
        if result.sft is None:
            return
        for key in _SFT_COUNTS:
            self.sft_counts[key] += result.sft[key]
        for pattern, rewrite in result.sft.get("jq_rewrites", ()):
            note = rewrite_note(pattern, rewrite)
            if note not in self._noted:
                self._noted.add(note)
                self.note(note)

    def _raise(
        self, unit: Unit, bases: list[int], piece_no: int, record: int, reason: str, detail: str
    ):
        path = self.files[unit.pieces[piece_no].input_index].path
        raise BadRecordError(path, bases[piece_no] + record, f"{reason}: {detail}")

    def finish(self, settings: dict):
        rejected_total = sum(self.rejected.values())
        if self.documents + rejected_total != self.records_read:
            raise AssertionError(
                f"record accounting broken: {self.documents} written + {rejected_total} rejected "
                f"!= {self.records_read} read"
            )
        rejects_path = self.rejects.commit() if self.rejects is not None else None
        if rejects_path is None:
            (Path(self.opts.output) / "rejects.jsonl").unlink(missing_ok=True)
        extra = {
            "convert": settings,
            "records_read": self.records_read,
            "documents_written": self.documents,
            "records_rejected": rejected_total,
            "rejected_by_reason": dict(sorted(self.rejected.items())),
        }
        if self.sft is not None:
            extra["sft_stats"] = dict(self.sft_counts)
        return self.writer.close(extra=extra), rejects_path

    def abandon(self) -> None:
        if self.rejects is not None:
            self.rejects.discard()
