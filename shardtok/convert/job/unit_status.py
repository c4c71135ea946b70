"""Where a planned job's units stand: done, failed, still to do, and the first failure.

``pending_units`` sorts a rank's units for run-units and the dask engine (kept, to tokenize,
stopped by a failure, or after it); ``status`` counts every unit for `shardtok convert status`;
``describe_failure`` names a unit's failure in one line, with the file's line exactly as the
one-command convert says it once every unit before it is done. Everything starts from one
listing of the work folder; markers are read in threads (remotely each read is latency-bound).

A unit that stops the run (a bad record under ``--on-bad-record error``, a tiktoken mismatch)
leaves a failure file. A failure stops applying when the job changes under it: a bad record
found under ``error`` is no failure for a ``skip`` job, nor a tiktoken mismatch for a job that
encodes with tokenizers; such units are simply tokenized again.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from shardtok.convert.inputs.units import Unit
from shardtok.convert.job.accounting import RecordAccounting
from shardtok.convert.job.failures import EncoderMismatch, UnitFailure, stops
from shardtok.convert.job.output_dir import finished_manifest, output_folder
from shardtok.convert.job.output_lock import os_error
from shardtok.convert.job.plan_file import load_plan
from shardtok.convert.job.spec import Plan
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.workdir import WorkDir, unit_base
from shardtok.errors import BadRecordError, ShardtokError, TokenizerMismatchError, UsageError
from shardtok.storage.folder import Folder

_MARKER_READERS = 16  # threads reading unit markers (remote reads are latency-bound)


def _stopping_failure(
    plan: Plan, workdir: WorkDir, index: int
) -> UnitFailure | EncoderMismatch | None:
    """Unit `index`'s recorded failure when it stops this job: written under this job's mode,
    well-formed for the plan's unit, and one that stops it (see failures.stops); else None,
    and the unit is tokenized again."""
    failure = workdir.load_failure(
        index, plan.job.on_bad_record == "error", pieces=len(plan.units[index].pieces)
    )
    return failure if stops(failure, plan.job.on_bad_record, plan.job.tokenizer.backend) else None


@dataclass
class Pending:
    """A job's units by what they need: `todo` (to tokenize, in index order), `kept` (done and
    checked), `stopped` (the unit whose recorded failure stops the conversion, if among them),
    `after_failure` (later than that unit: tokenizing them would be wasted work), and warnings
    about damaged units (in `todo` again)."""

    todo: list[Unit] = field(default_factory=list)
    kept: list[UnitResult] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    after_failure: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stops_at: int | None = None  # the first unit (of the whole job) whose failure applies


def _first_stop(plan: Plan, workdir: WorkDir, failed: set[int]) -> int | None:
    """The first unit whose recorded failure stops this job (a failure file is read only until
    one applies: usually just the first)."""
    for index in sorted(i for i in failed if i < len(plan.units)):
        if _stopping_failure(plan, workdir, index) is not None:
            return index
    return None


def pending_units(plan: Plan, workdir: WorkDir, indices) -> Pending:
    """Which of units `indices` still need tokenizing: one listing of the work folder, then a
    cheap check of the done ones (in threads: remotely each is a few small requests)."""
    done, failed = workdir.markers()
    stops_at = _first_stop(plan, workdir, failed)
    out = Pending(stops_at=stops_at)
    to_check = []
    for index in indices:
        if index in done:
            to_check.append(index)
        elif index == stops_at:
            out.stopped.append(index)
        elif stops_at is not None and index > stops_at:
            out.after_failure.append(index)
        else:  # (a failure before stops_at is one that no longer applies: done again)
            out.todo.append(plan.units[index])
    dtype, masks = plan.job.tokenizer.dtype, plan.job.sft is not None
    # Sizes only: every file's crc32 is the merge's check (here it would read every unit back
    # on each rerun).
    with ThreadPoolExecutor(_MARKER_READERS) as readers:
        checked = readers.map(
            lambda i: reusable_unit(workdir, plan.units[i], dtype, masks, verify=False), to_check
        )
        for index, (result, warning) in zip(to_check, checked):
            if result is not None:
                out.kept.append(result)
            elif stops_at is not None and index > stops_at:
                out.after_failure.append(index)
            else:
                out.todo.append(plan.units[index])
            if warning:
                out.warnings.append(warning)
    out.todo.sort(key=lambda u: u.index)
    out.after_failure.sort()
    return out


EXIT_COMPLETE, EXIT_FAILED, EXIT_MISSING = 0, 1, 3


@dataclass(frozen=True)
class Status:
    output: str
    units: int
    done: int
    failed: int
    missing: int
    complete: bool  # every unit done and none stops the conversion: merge can run
    merged: bool = False  # the dataset is written and the work folder gone
    failure: str | None = None  # the first failure in input order, one line
    failure_unit: int | None = None
    first_missing: int | None = None

    @property
    def exit_code(self) -> int:
        """0 complete, 1 a unit stops the conversion, 3 units are still to be done."""
        if self.complete:
            return EXIT_COMPLETE
        return EXIT_FAILED if self.failure is not None else EXIT_MISSING

    def to_json(self) -> dict:
        return {
            "output": self.output,
            "units": self.units,
            "done": self.done,
            "failed": self.failed,
            "missing": self.missing,
            "complete": self.complete,
            "merged": self.merged,
            "failure": self.failure,
            "failure_unit": self.failure_unit,
            "first_missing": self.first_missing,
            "exit_code": self.exit_code,
        }

    def summary(self) -> str:
        if self.merged:
            return f"{self.output}: merged (the dataset is complete)"
        lines = [
            f"{self.output}: {self.units:,} work units: {self.done:,} done, "
            f"{self.failed:,} failed, {self.missing:,} to do"
        ]
        if self.failure is not None:
            lines.append(f"  first failure: {self.failure}")
        elif self.complete:
            lines.append("  complete: run `shardtok convert merge`")
        elif self.first_missing is not None:
            lines.append(f"  first unit to do: {self.first_missing}")
        return "\n".join(lines)


def _read_marker(plan: Plan, workdir: WorkDir, index: int) -> UnitResult:
    """A done unit's marker alone (no file checked: status must stay cheap). One that is not
    this unit's (damaged, edited, another format) is a one-line error; run-units redoes it."""
    problem = None
    try:
        result = UnitResult.from_json(workdir.folder.read_bytes(unit_base(index) + ".json"))
    except ValueError as exc:  # (not JSON, or not a marker's fields)
        result, problem = None, f"is damaged ({exc})"
    if result is None:
        problem = problem or "was written by another shardtok"
    elif result.index != index:
        problem = f"is damaged (its marker names unit {result.index})"
    elif len(result.piece_records) != len(plan.units[index].pieces):
        problem = "is damaged (its marker does not have its plan's pieces)"
    if problem is not None:
        raise ShardtokError(
            f"work unit {workdir.unit_name(index)} {problem}; run `shardtok convert run-units` "
            "again, which tokenizes it again"
        )
    return result


def _first_error(plan: Plan, workdir: WorkDir, upto: int, failure=None) -> ShardtokError | None:
    """The error the merge stops with, from units 0..upto-1 (all done) and then `failure` (unit
    `upto`'s), or None. Under ``error`` a done unit may hold rejects: a ``skip`` job with the
    same units wrote it."""
    if plan.job.on_bad_record == "skip" and failure is None:
        return None  # rejects stop nothing: no marker needs reading
    accounting = RecordAccounting(
        list(plan.files), list(plan.units), skip_bad_records=plan.job.on_bad_record == "skip",
        sft=plan.job.sft is not None,
    )  # fmt: skip
    try:
        with ThreadPoolExecutor(_MARKER_READERS) as readers:
            for result in readers.map(lambda i: _read_marker(plan, workdir, i), range(upto)):
                accounting.add(result)
        if failure is not None:
            accounting.add(failure)
    except (BadRecordError, TokenizerMismatchError) as exc:
        return exc
    return None


def _piece_text(plan: Plan, unit: Unit, failure: UnitFailure | EncoderMismatch) -> str:
    """A failure where the file's line is not known yet: the piece and its own record number."""
    piece = unit.pieces[failure.piece]
    file = plan.files[piece.input_index]
    if piece.row_group is not None:
        where = f"row group {piece.row_group}"
    elif file.kind == "arrow":
        where = f"the record batches from byte {piece.start:,}"
    elif piece.start or piece.end < file.size:
        where = f"the part from byte {piece.start:,}"
    else:
        where = "the file"
    if piece.rows is not None:
        where += f" (its rows from {piece.rows[0]:,})"  # records count from the range's start
    what = (
        f"{failure.reason}: {failure.detail}"
        if isinstance(failure, UnitFailure)
        else f"tiktoken and tokenizers encode this document differently: {failure.detail}"
    )
    return (
        f"{file.path}, record {failure.record} of {where} (work unit {unit.index}): {what} "
        "(its line in the file is known once every unit before it is done)"
    )


def describe_failure(plan: Plan, workdir: WorkDir, index: int) -> str:
    """Unit `index`'s failure in one line: file and line exactly as the one-command convert
    says it when every earlier unit is done, else the unit and piece."""
    failure = _stopping_failure(plan, workdir, index)
    if failure is None:
        return f"work unit {workdir.unit_name(index)} failed; its failure file cannot be read"
    done, _ = workdir.markers()
    if all(i in done for i in range(index)):
        error = _first_error(plan, workdir, index, failure)
        if error is not None:
            return str(error)
    return _piece_text(plan, plan.units[index], failure)


def status(output: str, storage_options: dict | None = None) -> Status:
    """Where the conversion in `output` stands. Cheap: one listing, and the markers of the
    units before the first failure (or, under ``error``, of every unit once all are done)."""
    folder = output_folder(output, storage_options)
    workdir = WorkDir(folder)
    try:
        return _status(folder, workdir)
    except OSError as exc:
        raise os_error(exc, folder.display) from exc


def _status(folder: Folder, workdir: WorkDir) -> Status:
    try:
        plan = load_plan(workdir)
    except UsageError:
        if finished_manifest(folder) is not None:  # merged, work folder removed
            return Status(folder.display, 0, 0, 0, 0, complete=True, merged=True)
        raise
    done_markers, failed_markers = workdir.markers()
    counts = {"done": 0, "failed": 0, "missing": 0}
    first_failed = first_missing = None
    for unit in plan.units:
        i = unit.index
        if i in done_markers:
            counts["done"] += 1
        elif i in failed_markers and _stopping_failure(plan, workdir, i) is not None:
            counts["failed"] += 1
            first_failed = i if first_failed is None else first_failed
        else:
            counts["missing"] += 1
            first_missing = i if first_missing is None else first_missing
    common = dict(output=folder.display, units=len(plan.units), **counts)
    if first_failed is not None:
        return Status(
            **common, complete=False, failure=describe_failure(plan, workdir, first_failed),
            failure_unit=first_failed, first_missing=first_missing,
        )  # fmt: skip
    if first_missing is not None:
        return Status(**common, complete=False, first_missing=first_missing)
    error = _first_error(plan, workdir, len(plan.units))
    if error is not None:
        return Status(**common, complete=False, failure=str(error))
    return Status(**common, complete=True)


def reusable_unit(
    workdir: WorkDir, unit: Unit, dtype: np.dtype | str, masks: bool, *, verify: bool = True
) -> tuple[UnitResult | None, str | None]:
    """A unit finished earlier: (its result, None) when its files are intact, (None, None) when
    it never finished, else (None, a warning) with its marker dropped so that it is tokenized
    again. `verify=False` checks the files' sizes but not their crc32 (see load_result)."""
    previous = workdir.load_result(
        unit.index, np.dtype(dtype), masks=masks, verify=verify, pieces=len(unit.pieces)
    )
    if not isinstance(previous, str):
        return previous, None
    # Redoing it gives the same bytes, so the output stays identical to a clean run.
    workdir.discard_unit(unit.index)
    return None, (
        f"work unit {workdir.unit_name(unit.index)} is damaged ({previous}); tokenizing it again"
    )
