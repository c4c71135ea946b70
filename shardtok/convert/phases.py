"""The conversion as phases any scheduler can drive: plan, run-units, merge (and status).

``plan`` writes the job into the work folder (plan.json, tokenizer.json; see job.py).
``run_units(output, rank, world_size)`` tokenizes the units i ≡ rank (mod world_size) that are
not done yet, on as many machines and as often as the scheduler likes: a unit's files are
deterministic and its marker is written last, so a rerun, a requeued task or two copies of one
rank at once only ever write the same bytes, and nothing is swept under a live writer. ``merge``
writes the shards, rejects.jsonl and index.json (last), byte-identical to the one-command
``shardtok convert ... --workers 1`` with the same unit size. ``status`` is unit_status.py's.

A unit that stops the run (a bad record under ``--on-bad-record error``, a tiktoken mismatch)
leaves a failure file; it is not redone while it still applies (see unit_status.py), so every
rank, status and the merge report the same first failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from pathlib import Path

from shardtok.convert.job import Job, distributed_unit_size, settings
from shardtok.convert.merge import merge_units
from shardtok.convert.output_dir import finished_manifest, output_folder
from shardtok.convert.output_lock import OutputLock, os_error
from shardtok.convert.plan_file import load_job, name_problem
from shardtok.convert.pool import usable_cores, worker_pool
from shardtok.convert.progress import ConvertProgress, ConvertResult, plural, size_text
from shardtok.convert.runner import (
    ConvertOptions,
    finished_result,
    open_job,
    plan_job,
    worker_config,
)
from shardtok.convert.unit_result import UnitResult
from shardtok.convert.unit_status import describe_failure, pending_units
from shardtok.convert.workdir import WorkDir
from shardtok.errors import UsageError
from shardtok.storage.folder import Folder

logger = logging.getLogger(__name__)

# -- a planned job ---------------------------------------------------------------------------


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
    unit_size_chosen: bool = False  # no --unit-size: the size was chosen for the corpus

    def summary(self) -> str:
        if self.already_complete:
            return f"{self.output} already holds this conversion; nothing to plan."
        kept = f"; {self.units_done:,} already done" if self.units_done else ""
        units, files = self.units, self.input_files
        text = (
            f"planned {units:,} work unit{plural(units)} of {size_text(self.unit_size)} from "
            f"{files:,} input file{plural(files)} ({size_text(self.input_bytes)}) in "
            f"{self.output}{kept}"
        )
        if self.unit_size_chosen:
            text += (
                "\n  note: the unit size was chosen for this corpus (--unit-size sets it; frames "
                "end at unit boundaries, so it shapes the shards' bytes)"
            )
        return text


def plan(opts: ConvertOptions) -> PlanSummary:
    """Write the job of `opts` into its output's work folder (plan.json and tokenizer.json).

    An equal plan keeps its finished units (other merge options, such as the shard size, just
    update it); any other work there is discarded, as the one-command convert does. Without
    --unit-size, units grow for large corpora (see job.distributed_unit_size)."""
    problem = name_problem(opts.name)
    if problem is not None:  # refused now, not by every rank reading the plan back
        raise UsageError(f"--name {problem}")
    with open_job(opts, remote=True) as (opts, files):
        planned = plan_job(opts, files, distributed_unit_size)
    input_bytes = sum(f.size for f in files)
    if planned.done is not None:
        return PlanSummary(opts.output, 0, planned.unit_size, len(files), input_bytes, 0, True)
    done, _ = planned.workdir.markers()
    summary = PlanSummary(
        opts.output, len(planned.units), planned.unit_size, len(files), input_bytes,
        len(done & {u.index for u in planned.units}), unit_size_chosen=opts.unit_size is None,
    )  # fmt: skip
    logger.info("%s", summary.summary().splitlines()[0])
    return summary


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


def _check_rank(rank: int, world_size: int) -> None:
    for name, value in (("rank", rank), ("world size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"the {name} must be an integer, got {value!r}")
    if world_size < 1:
        raise UsageError(f"the world size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside a world of {world_size} (0..{world_size - 1})")


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
                futures = {pool.submit(u): u.index for u in pending.todo}
            logger.info(
                "rank %d of %d: %d work units, %d done before, %d to tokenize in %d process(es)",
                rank, world_size, len(mine), len(pending.kept), len(pending.todo), workers,
            )  # fmt: skip
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
