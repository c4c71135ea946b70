"""The main process's half of a conversion: finished units to shards, in unit order.

Units arrive in any order from the workers; the runner hands them here in input order, so the
DatasetWriter sees the same documents, frames (and, for SFT, masks) whatever the worker count.
The record accounting (read = written + rejected, a unit's first bad record as the error naming
file and line) is RecordAccounting's, shared with the phased merge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardtok.convert.accounting import RecordAccounting
from shardtok.convert.failures import EncoderMismatch, UnitFailure
from shardtok.convert.inputs import InputFile
from shardtok.convert.output_dir import RejectsFile
from shardtok.convert.unit_result import UnitResult
from shardtok.convert.units import Unit
from shardtok.convert.workdir import WorkDir
from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.shard_plan import encode_frames


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
        self.accounting = RecordAccounting(
            files,
            units,
            skip_bad_records=self.rejects is not None,
            sft=self.sft is not None,
            write_reject=None if self.rejects is None else self.rejects.write,
            note=note,
        )

    @property
    def records_read(self) -> int:
        return self.accounting.records_read

    @property
    def documents(self) -> int:
        return self.accounting.documents

    @property
    def rejected(self) -> dict[str, int]:
        return self.accounting.rejected

    @property
    def sft_counts(self) -> dict | None:
        return self.accounting.sft_counts

    def add(self, result: UnitResult | UnitFailure | EncoderMismatch) -> None:
        bases = self.accounting.add(result)
        tokens, docs = self.workdir.load_unit(result.index, self.dtype)
        masks = None if self.sft is None else self.workdir.load_masks(result.index)
        if result.frame_settings == [self.opts.frame_size, self.opts.compression_level]:
            frames, stored = result.frames, self.workdir.load_frames(result.index)
        else:  # persisted by a run with other --frame-size/--compression-level: re-encode
            frames, stored = encode_frames(
                tokens, docs[:, 2], self.opts.frame_size, self.opts.compression_level
            )
        paths = self.accounting.paths(self.units[result.index])
        records = np.asarray(bases, dtype=np.int64)[docs[:, 0]] + docs[:, 1]
        self.writer.add_frames(
            tokens,
            docs[:, 2],
            frames,
            stored,
            provenance=(paths, docs[:, 0], records),
            masks=masks,
        )

    def finish(self, settings: dict):
        extra = self.accounting.extra(settings)
        rejects_path = self.rejects.commit() if self.rejects is not None else None
        if rejects_path is None:
            (Path(self.opts.output) / "rejects.jsonl").unlink(missing_ok=True)
        return self.writer.close(extra=extra), rejects_path

    def abandon(self) -> None:
        if self.rejects is not None:
            self.rejects.discard()
