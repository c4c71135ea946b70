"""The record accounting of a conversion, kept over unit results in input order.

Every record read is either written as a document or rejected, and every reported record number
is the input file's own: a unit only knows its records relative to the start of each of its
pieces, so a piece's base is the count of records that earlier units consumed from the same file.
Units must therefore come here in input order; whatever scheduled them, the first bad record (or
tiktoken mismatch) of the input is then the first one raised. The one-command run's assembler,
the phased merge and `convert status` all keep their books here, so they agree to the byte.
"""

from __future__ import annotations

from collections.abc import Callable

from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.units import Unit
from shardtok.convert.job.failures import EncoderMismatch, UnitFailure
from shardtok.convert.job.unit_result import SFT_COUNTS, UnitResult
from shardtok.errors import BadRecordError, TokenizerMismatchError

RejectWriter = Callable[[str, int, str, str], None]


def rewrite_note(pattern: str, rewrite: str) -> str:
    return (
        f"jq pattern {pattern!r} cannot index a list in jq (Cannot index array with ...); "
        f"records where it fails use {rewrite!r}, which selects each element"
    )


class RecordAccounting:
    """Counts, rejects and record bases over unit results fed in input order.

    `skip_bad_records`: rejects are counted and passed to `write_reject(file, line, reason,
    detail)` (output_dir.RejectsFile.write; None: only counted, as status does); otherwise a
    unit's first reject is raised as the BadRecordError the run stops with. `sft`: count the units' SFT statistics. `note` prints a
    one-line note (once per distinct note).
    """

    def __init__(
        self,
        files: list[InputFile],
        units: list[Unit],
        *,
        skip_bad_records: bool,
        sft: bool = False,
        write_reject: RejectWriter | None = None,
        note: Callable[[str], None] = lambda text: None,
    ):
        self.files = files
        self.units = units
        self.skip_bad_records = skip_bad_records
        self.note = note
        self._write_reject = write_reject
        self.records_seen = [0] * len(files)  # lines/rows of each file consumed so far
        self.records_read = 0
        self.documents = 0
        self.rejected: dict[str, int] = {}
        self.sft_counts = dict.fromkeys(SFT_COUNTS, 0) if sft else None
        self._noted: set[str] = set()

    def paths(self, unit: Unit) -> list[str]:
        """The input path of each of the unit's pieces."""
        return [self.files[p.input_index].path for p in unit.pieces]

    def add(self, result: UnitResult | UnitFailure | EncoderMismatch) -> list[int]:
        """Account for the next unit in input order; returns its pieces' record bases (add them
        to the unit's own record numbers for the file's). A failure, or under error mode a
        reject, raises the error the conversion stops with."""
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
            if not self.skip_bad_records:
                self._raise(unit, bases, piece_no, record, reason, detail)
            if self._write_reject is not None:
                path = self.files[unit.pieces[piece_no].input_index].path
                self._write_reject(path, bases[piece_no] + record, reason, detail)
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.records_read += result.records_read
        self.documents += result.num_documents
        return bases

    def _sft_stats(self, result: UnitResult) -> None:
        if result.sft is None or self.sft_counts is None:
            return
        for key in SFT_COUNTS:
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

    def extra(self, settings: dict) -> dict:
        """The manifest's `extra`, once every unit is in; checks read = written + rejected."""
        rejected_total = sum(self.rejected.values())
        if self.documents + rejected_total != self.records_read:
            raise AssertionError(
                f"record accounting broken: {self.documents} written + {rejected_total} rejected "
                f"!= {self.records_read} read"
            )
        extra = {
            "convert": settings,
            "records_read": self.records_read,
            "documents_written": self.documents,
            "records_rejected": rejected_total,
            "rejected_by_reason": dict(sorted(self.rejected.items())),
        }
        if self.sft_counts is not None:
            extra["sft_stats"] = dict(self.sft_counts)
        return extra
