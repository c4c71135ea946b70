"""The conversion as phases any scheduler can drive: plan, run-units, status, merge.

``plan`` writes the job into the work folder (plan.json, tokenizer.json; see job.py).
``run_units(output, rank, world_size)`` tokenizes the units i ≡ rank (mod world_size) that are
not done yet, on as many machines and as often as the scheduler likes: a unit's files are
deterministic and its marker is written last, so a rerun, a requeued task or two copies of one
rank at once only ever write the same bytes, and nothing is swept under a live writer. ``status``
counts done, failed and missing units from one listing and names the first failure in input
order. ``merge`` writes the shards, rejects.jsonl and index.json (last), byte-identical to the
one-command ``shardtok convert ... --workers 1`` with the same unit size.

A unit that stops the run (a bad record under ``--on-bad-record error``, a tiktoken mismatch)
leaves a failure file; it is not redone while it still applies, so every rank, status and the
merge report the same first failure. A failure stops applying when the job changes under it:
a bad record found under ``error`` is no failure for a ``skip`` job, nor a tiktoken mismatch
for a job that encodes with tokenizers; such units are simply tokenized again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardtok.convert.accounting import RecordAccounting
from shardtok.convert.failures import EncoderMismatch, UnitFailure
from shardtok.convert.job import (
    PLAN_NAME,
    TOKENIZER_NAME,
    Job,
    distributed_unit_size,
    parse_plan,
    settings,
)
from shardtok.convert.merge import merge_units
from shardtok.convert.output_dir import finished_manifest, output_folder
from shardtok.convert.output_lock import OutputLock, os_error
from shardtok.convert.progress import ConvertProgress, ConvertResult
from shardtok.convert.runner import (
    ConvertOptions,
    finished_result,
    open_job,
    plan_job,
    usable_cores,
    worker_config,
    worker_pool,
)
from shardtok.convert.units import Unit
from shardtok.convert.workdir import UnitResult, WorkDir, unit_base
from shardtok.convert.worker import tokenize_unit
from shardtok.errors import BadRecordError, ShardtokError, TokenizerMismatchError, UsageError
from shardtok.storage.folder import Folder

_MARKER_READERS = 16  # threads reading unit markers for status (remote reads are latency-bound)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# -- reading the plan ------------------------------------------------------------------------


def load_job(workdir: WorkDir) -> Job:
    """The job in the work folder's plan.json, checked (PlanError, one line)."""
    where = workdir.folder.display_of(PLAN_NAME)
    try:
        data = workdir.folder.read_bytes(PLAN_NAME)
    except FileNotFoundError:
        raise UsageError(
            f"no plan in {workdir.output.display} ({where} is missing): run `shardtok convert "
            "plan INPUT... -o OUTPUT` first"
        ) from None
    try:
        backend = workdir.read_file(TOKENIZER_NAME)
    except FileNotFoundError:
        backend = None
    return parse_plan(data, backend, where)


def job_options(job: Job, output: str, storage_options: dict | None = None) -> ConvertOptions:
    """The ConvertOptions of a planned job, writing to `output` (where its plan was found)."""
    return ConvertOptions(
        inputs=tuple(f.path for f in job.files),
        output=output,
        tokenizer=job.tokenizer,
        text_key=job.text_key,
        txt_mode=job.txt_mode,
        on_bad_record=job.on_bad_record,
        shard_size=job.shard_size,
        compression_level=job.compression_level,
        frame_size=job.frame_size,
        unit_size=job.unit_size,
        name=job.name,
        sft=job.sft,
        storage_options=storage_options,
    )


def job_worker_config(job: Job, output: str, storage_options: dict | None):
    return worker_config(job_options(job, output, storage_options), job.reading_files())


def _stop_at_bad_record(job: Job) -> bool:
    """The job's mode as the work folder records failures."""
    return job.on_bad_record == "error"


def applies(job: Job, failure: UnitFailure | EncoderMismatch | None) -> bool:
    """Whether a recorded failure stops this job (else the unit is tokenized again)."""
    if isinstance(failure, UnitFailure):
        return job.on_bad_record == "error"
    if isinstance(failure, EncoderMismatch):
        return job.tokenizer.backend == "tiktoken"
    return False


def _workdir(output: str, storage_options: dict | None) -> tuple[Folder, WorkDir]:
    folder = output_folder(output, storage_options)
    return folder, WorkDir(folder)


@contextlib.contextmanager
def _held(folder: Folder) -> Iterator[None]:
    """The output's flock for a local folder (one plan or merge at a time, and none during a
    one-command convert); an object store has no lock."""
    if folder.is_local and os.path.isdir(folder.location.local_path):
        with OutputLock(Path(folder.location.local_path)):
            yield
    else:
        yield


# -- plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanSummary:
    output: str
    units: int
    unit_size: int
    input_files: int
    input_bytes: int
    units_done: int  # finished units kept from an earlier run of the same units
    already_complete: bool = False  # the output already holds this job's dataset

    def summary(self) -> str:
        if self.already_complete:
            return f"{self.output} already holds this conversion; nothing to plan."
        kept = f"; {self.units_done:,} already done" if self.units_done else ""
        return (
            f"planned {self.units:,} work unit{_s(self.units)} of {_size(self.unit_size)} from "
            f"{self.input_files:,} input file{_s(self.input_files)} ({_size(self.input_bytes)}) "
            f"in {self.output}{kept}"
        )


def plan(opts: ConvertOptions) -> PlanSummary:
    """Write the job of `opts` into its output's work folder (plan.json and tokenizer.json).

    An equal plan keeps its finished units (other merge options, such as the shard size, just
    update it); any other work there is discarded, as the one-command convert does. Without
    --unit-size, units grow for large corpora (see job.distributed_unit_size)."""
    with open_job(opts, remote=True) as (opts, files):
        planned = plan_job(opts, files, distributed_unit_size)
    input_bytes = sum(f.size for f in files)
    if planned.done is not None:
        return PlanSummary(opts.output, 0, planned.unit_size, len(files), input_bytes, 0, True)
    done, _ = planned.workdir.markers()
    if opts.progress and opts.unit_size is None:
        print(
            f"note: unit size {_size(planned.unit_size)} ({len(planned.units):,} units; "
            "--unit-size changes it, and with it where frames end)",
            file=sys.stderr,
        )
    return PlanSummary(
        opts.output, len(planned.units), planned.unit_size, len(files), input_bytes,
        len(done & {u.index for u in planned.units}),
    )  # fmt: skip


# -- run-units -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """What one run-units call did. `failed`: its units that stop the conversion (their
    failure is recorded; status and merge name the first one in input order)."""

    output: str
    rank: int
    world_size: int
    units: int  # this rank's units
    already_done: int
    tokenized: int
    failed: tuple[int, ...] = ()
    seconds: float = 0.0
    # The failure that stops the conversion, when it holds up this rank (one of its units
    # failed, or its later units were left undone)
    failure: str | None = None
    after_failure: int = 0  # units left undone: the conversion stops before them

    def summary(self) -> str:
        line = (
            f"rank {self.rank} of {self.world_size}: {self.units:,} work units, "
            f"{self.already_done:,} already done, {self.tokenized:,} tokenized in "
            f"{self.seconds:.1f} s"
        )
        if self.failed:
            line += f", {len(self.failed):,} stopped the conversion"
        if self.after_failure:
            line += f", {self.after_failure:,} after a failure left undone"
        return line


def check_done(
    workdir: WorkDir, index: int, dtype: str, masks: bool
) -> tuple[UnitResult | None, str | None]:
    """A unit with a done marker: its result when its files are all there in their recorded
    sizes, else (None, a warning), its marker dropped so that it is redone. Every file's crc32
    is the merge's check: here it would read every unit back on each rerun."""
    previous = workdir.load_result(index, np.dtype(dtype), masks=masks, verify=False)
    if isinstance(previous, UnitResult):
        return previous, None
    if previous is None:  # written by another unit format: redone like a missing unit
        return None, None
    # Redoing it gives the same bytes, so the output stays identical to a clean run.
    workdir.discard_unit(index)
    return None, (
        f"warning: work unit {workdir.unit_name(index)} is damaged ({previous}); tokenizing it "
        "again"
    )


def _check_rank(rank: int, world_size: int) -> None:
    for name, value in (("rank", rank), ("world size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"the {name} must be an integer, got {value!r}")
    if world_size < 1:
        raise UsageError(f"the world size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside a world of {world_size} (0..{world_size - 1})")


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


def first_stop(job: Job, workdir: WorkDir, failed: set[int]) -> int | None:
    """The first unit whose recorded failure stops this job (a failure file is read only until
    one applies: usually just the first)."""
    stop = _stop_at_bad_record(job)
    for index in sorted(i for i in failed if i < len(job.units)):
        if applies(job, workdir.load_failure(index, stop)):
            return index
    return None


def pending_units(job: Job, workdir: WorkDir, indices) -> Pending:
    """Which of units `indices` still need tokenizing: one listing of the work folder, then a
    cheap check of the done ones (in threads: remotely each is a few small requests)."""
    done, failed = workdir.markers()
    stops_at = first_stop(job, workdir, failed)
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
            out.todo.append(job.units[index])
    dtype, masks = job.tokenizer.dtype.name, job.sft is not None
    with ThreadPoolExecutor(_MARKER_READERS) as readers:
        checked = readers.map(lambda i: check_done(workdir, i, dtype, masks), to_check)
        for index, (result, warning) in zip(to_check, checked):
            if result is not None:
                out.kept.append(result)
            elif stops_at is not None and index > stops_at:
                out.after_failure.append(index)
            else:
                out.todo.append(job.units[index])
            if warning:
                out.warnings.append(warning)
    out.todo.sort(key=lambda u: u.index)
    out.after_failure.sort()
    return out


def run_units(
    output: str,
    rank: int,
    world_size: int,
    *,
    workers: int = 1,
    storage_options: dict | None = None,
    progress: bool = True,
    start_method: str | None = None,
) -> RunSummary:
    """Tokenize the units i ≡ `rank` (mod `world_size`) of the plan in `output` that are not
    done, in `workers` local processes (0: every core). Idempotent; two copies of one rank may
    run at once. A unit whose failure stops the conversion is recorded, and not retried."""
    started = time.monotonic()
    _check_rank(rank, world_size)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UsageError(f"workers must be a count (0: every core), got {workers!r}")
    folder, workdir = _workdir(output, storage_options)
    try:
        job = load_job(workdir)
        mine = range(rank, len(job.units), world_size)
        pending = pending_units(job, workdir, mine)
        failed = list(pending.stopped)
        tokenized = 0
        workers = max(1, min(workers or usable_cores(), len(pending.todo) or 1))
        with contextlib.ExitStack() as stack:
            futures = {}
            if pending.todo:
                config = job_worker_config(job, output, storage_options)
                pool = stack.enter_context(worker_pool(config, workers, start_method))
                # In index order: a rank's earliest failure is found first.
                futures = {pool.submit(tokenize_unit, u): u.index for u in pending.todo}
            bar = ConvertProgress(sum(job.units[i].nbytes for i in mine), progress)
            stack.callback(bar.close)
            for warning in pending.warnings:
                bar.note(warning)
            for result in pending.kept:
                bar.unit_done(result.input_bytes, result.num_documents, result.num_tokens, True)
            while futures:
                finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = futures.pop(future)
                    outcome = future.result()  # an error (a damaged input) stops the rank
                    if isinstance(outcome, UnitResult):
                        tokenized += 1
                        bar.unit_done(
                            outcome.input_bytes, outcome.num_documents, outcome.num_tokens, False
                        )
                        continue
                    failed.append(index)
                    # The conversion stops at this unit: this rank's later units are wasted work
                    # (earlier ones still matter: they give the failure its exact line).
                    for other in [f for f, i in futures.items() if i > index]:
                        if other.cancel():
                            del futures[other]
        failed.sort()
        known = failed + ([pending.stops_at] if pending.stops_at is not None else [])
        stops_at = min(known, default=None)
        undone = len(mine) - len(pending.kept) - tokenized - len(failed)
        failure = None
        if stops_at is not None and (failed or undone):  # this rank is held up by it
            failure = describe_failure(job, workdir, stops_at)
        return RunSummary(
            folder.display, rank, world_size, len(mine), len(pending.kept), tokenized,
            tuple(failed), time.monotonic() - started, failure, undone,
        )  # fmt: skip
    except OSError as exc:
        raise os_error(exc, folder.display) from exc


# -- status ----------------------------------------------------------------------------------


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


def _read_marker(workdir: WorkDir, index: int) -> UnitResult:
    """A done unit's marker alone (no file checked: status must stay cheap)."""
    result = UnitResult.from_json(workdir.folder.read_bytes(unit_base(index) + ".json"))
    if result is None or result.index != index:
        raise ShardtokError(
            f"work unit {workdir.unit_name(index)} was written by another shardtok; run "
            "`shardtok convert run-units` again"
        )
    return result


def _first_error(job: Job, workdir: WorkDir, upto: int, failure=None) -> ShardtokError | None:
    """The error the merge stops with, from units 0..upto-1 (all done) and then `failure` (unit
    `upto`'s), or None. Under ``error`` a done unit may hold rejects: a ``skip`` job with the
    same units wrote it."""
    if job.on_bad_record == "skip" and failure is None:
        return None  # rejects stop nothing: no marker needs reading
    accounting = RecordAccounting(
        list(job.files), list(job.units), skip_bad_records=job.on_bad_record == "skip",
        sft=job.sft is not None, write_reject=lambda *reject: None,
    )  # fmt: skip
    try:
        with ThreadPoolExecutor(_MARKER_READERS) as readers:
            for result in readers.map(lambda i: _read_marker(workdir, i), range(upto)):
                accounting.add(result)
        if failure is not None:
            accounting.add(failure)
    except (BadRecordError, TokenizerMismatchError) as exc:
        return exc
    return None


def _piece_text(job: Job, unit: Unit, failure: UnitFailure | EncoderMismatch) -> str:
    """A failure where the file's line is not known yet: the piece and its own record number."""
    piece = unit.pieces[failure.piece]
    file = job.files[piece.input_index]
    if piece.row_group is not None:
        where = f"row group {piece.row_group}"
    elif piece.start or piece.end < file.size:
        where = f"the part from byte {piece.start:,}"
    else:
        where = "the file"
    what = (
        f"{failure.reason}: {failure.detail}"
        if isinstance(failure, UnitFailure)
        else f"tiktoken and tokenizers encode this document differently: {failure.detail}"
    )
    return (
        f"{file.path}, record {failure.record} of {where} (work unit {unit.index}): {what} "
        "(its line in the file is known once every unit before it is done)"
    )


def describe_failure(job: Job, workdir: WorkDir, index: int) -> str:
    """Unit `index`'s failure in one line: file and line exactly as the one-command convert
    says it when every earlier unit is done, else the unit and piece."""
    failure = workdir.load_failure(index, _stop_at_bad_record(job))
    if failure is None:
        return f"work unit {workdir.unit_name(index)} failed; its failure file cannot be read"
    done, _ = workdir.markers()
    if all(i in done for i in range(index)):
        error = _first_error(job, workdir, index, failure)
        if error is not None:
            return str(error)
    return _piece_text(job, job.units[index], failure)


def status(output: str, storage_options: dict | None = None) -> Status:
    """Where the conversion in `output` stands. Cheap: one listing, and the markers of the
    units before the first failure (or, under ``error``, of every unit once all are done)."""
    folder, workdir = _workdir(output, storage_options)
    try:
        return _status(folder, workdir)
    except OSError as exc:
        raise os_error(exc, folder.display) from exc


def _status(folder: Folder, workdir: WorkDir) -> Status:
    try:
        job = load_job(workdir)
    except UsageError:
        if finished_manifest(folder) is not None:  # merged, work folder removed
            return Status(folder.display, 0, 0, 0, 0, complete=True, merged=True)
        raise
    done_markers, failed_markers = workdir.markers()
    stop = _stop_at_bad_record(job)
    counts = {"done": 0, "failed": 0, "missing": 0}
    first_failed = first_missing = None
    for unit in job.units:
        i = unit.index
        if i in done_markers:
            counts["done"] += 1
        elif i in failed_markers and applies(job, workdir.load_failure(i, stop)):
            counts["failed"] += 1
            first_failed = i if first_failed is None else first_failed
        else:
            counts["missing"] += 1
            first_missing = i if first_missing is None else first_missing
    common = dict(output=folder.display, units=len(job.units), **counts)
    if first_failed is not None:
        return Status(
            **common, complete=False, failure=describe_failure(job, workdir, first_failed),
            failure_unit=first_failed, first_missing=first_missing,
        )  # fmt: skip
    if first_missing is not None:
        return Status(**common, complete=False, first_missing=first_missing)
    error = _first_error(job, workdir, len(job.units))
    if error is not None:
        return Status(**common, complete=False, failure=str(error))
    return Status(**common, complete=True)


# -- merge -----------------------------------------------------------------------------------


def merge(
    output: str,
    *,
    jobs: int | None = None,
    storage_options: dict | None = None,
    keep_work: bool = False,
    progress: bool = True,
) -> ConvertResult:
    """Write the dataset from the finished units: shards, rejects.jsonl, index.json last; then
    remove the work folder (unless `keep_work`). Raises the first failure in input order as the
    one-command convert does, or names the first unit still to do. `jobs`: shard-writing
    processes (default: every core). An output already merged is "nothing to do"."""
    started = time.monotonic()
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"jobs must be at least 1, got {jobs!r}")
    folder, workdir = _workdir(output, storage_options)
    try:
        with _held(folder):
            try:
                job = load_job(workdir)
            except UsageError:
                done = finished_manifest(folder)
                if done is None:
                    raise
                return finished_result(output, done, storage_options)
            result = merge_job(
                job, workdir, output, storage_options, jobs=jobs or usable_cores(),
                progress=progress, keep_work=keep_work,
            )  # fmt: skip
    except OSError as exc:
        raise os_error(exc, folder.display) from exc
    result.seconds = time.monotonic() - started
    return result


def merge_job(
    job: Job,
    workdir: WorkDir,
    output: str,
    storage_options: dict | None,
    *,
    jobs: int = 1,
    map_tasks=None,
    progress: bool = True,
    keep_work: bool = False,
) -> ConvertResult:
    """The merge of `job` (whoever holds the output's lock calls this): see :func:`merge`.
    `map_tasks` runs the merge's tasks on an engine (see merge.merge_units)."""
    opts = job_options(job, output, storage_options)
    result = merge_units(
        opts, list(job.files), list(job.units), workdir,
        settings(opts, list(job.files), job.unit_size), jobs=jobs, map_tasks=map_tasks,
        progress=progress,
    )  # fmt: skip
    if not keep_work:
        workdir.remove()
    return ConvertResult(
        workdir.output.display, result.manifest, result.records_read, result.documents,
        dict(result.rejected), units_total=len(job.units), units_reused=len(job.units),
        rejects_path=result.rejects_path, stored_token_bytes=result.stored_token_bytes,
        sft=result.sft_counts,
    )  # fmt: skip
