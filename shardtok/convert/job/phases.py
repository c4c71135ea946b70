"""The phases every engine runs: plan, (run-units: engines/ranks.py), merge, and status.

``plan`` writes the job into the work folder (plan.json, tokenizer.json; see spec.py).
``run_units`` (engines/ranks.py) tokenizes a rank's share of the units, on as many machines and
as often as the scheduler likes. ``merge`` writes the shards, rejects.jsonl and index.json
(last) through merge.py's ShardAssembly, the one path from finished units to a dataset, which
the one-command convert and the dask engine use too: the bytes are the same whoever ran the
phases. ``status`` is unit_status.py's.

A unit that stops the run (a bad record under ``--on-bad-record error``, a tiktoken mismatch)
leaves a failure file; it is not redone while it still applies (see unit_status.py), so every
rank, status and the merge report the same first failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shardtok._process import usable_cores
from shardtok.convert.job.merge import merge_units
from shardtok.convert.job.output_dir import finished_manifest, output_folder
from shardtok.convert.job.output_lock import OutputLock, os_error
from shardtok.convert.job.plan_file import load_plan, name_problem
from shardtok.convert.job.planning import finished_result, open_job, plan_job
from shardtok.convert.job.progress import ConvertResult, plural, size_text
from shardtok.convert.job.spec import (
    ConvertJob,
    Plan,
    RunOptions,
    WorkerConfig,
    distributed_unit_size,
)
from shardtok.convert.job.workdir import WorkDir
from shardtok.errors import UsageError
from shardtok.storage.folder import Folder

logger = logging.getLogger(__name__)

# -- a planned job ---------------------------------------------------------------------------


def worker_config(plan: Plan, output: str, storage_options: dict | None) -> WorkerConfig:
    """A worker's configuration for `plan`, writing to `output` (where its plan was found)."""
    job = dataclasses.replace(plan.job, output=output)
    return WorkerConfig(job, plan.reading_files(), storage_options)


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


def plan(job: ConvertJob, run: RunOptions | None = None) -> PlanSummary:
    """Write `job` into its output's work folder (plan.json and tokenizer.json).

    An equal plan keeps its finished units (other merge options, such as the shard size, just
    update it); any other work there is discarded, as the one-command convert does. Without
    --unit-size, units grow for large corpora (see job.distributed_unit_size)."""
    run = run or RunOptions()
    problem = name_problem(job.name)
    if problem is not None:  # refused now, not by every rank reading the plan back
        raise UsageError(f"--name {problem}")
    chosen = job.unit_size is None
    with open_job(job, run, remote=True) as (job, files):
        planned = plan_job(job, files, run, distributed_unit_size)
    input_bytes = sum(f.size for f in files)
    unit_size = planned.job.unit_size
    assert unit_size is not None
    if planned.done is not None:
        return PlanSummary(job.output, 0, unit_size, len(files), input_bytes, 0, True)
    done, _ = planned.workdir.markers()
    summary = PlanSummary(
        job.output, len(planned.units), unit_size, len(files), input_bytes,
        len(done & {u.index for u in planned.units}), unit_size_chosen=chosen,
    )  # fmt: skip
    logger.info("%s", summary.summary().splitlines()[0])
    return summary


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
                plan = load_plan(workdir)
            except UsageError:
                done = finished_manifest(folder)
                if done is None:
                    raise
                return finished_result(output, done, storage_options)
            result = merge_job(
                plan, workdir, output, storage_options, jobs=jobs or usable_cores(),
                progress=progress, keep_work=keep_work,
            )  # fmt: skip
    except OSError as exc:
        raise os_error(exc, folder.display) from exc
    result.seconds = time.monotonic() - started
    return result


def merge_job(
    plan: Plan,
    workdir: WorkDir,
    output: str,
    storage_options: dict | None,
    *,
    jobs: int = 1,
    map_tasks=None,
    progress: bool | str = True,
    keep_work: bool = False,
    start_method: str | None = None,
) -> ConvertResult:
    """The merge of `plan` (whoever holds the output's lock calls this): see :func:`merge`.
    `map_tasks` runs the merge's tasks on an engine (see merge.merge_units)."""
    job = dataclasses.replace(plan.job, output=output)
    result = merge_units(
        job, list(plan.files), list(plan.units), workdir, jobs=jobs, map_tasks=map_tasks,
        progress=progress, start_method=start_method, storage_options=storage_options,
    )  # fmt: skip
    if not keep_work:
        workdir.remove()
    return ConvertResult(
        workdir.output.display, result.manifest, result.records_read, result.documents,
        dict(result.rejected), units_total=len(plan.units), units_reused=len(plan.units),
        rejects_path=result.rejects_path, stored_token_bytes=result.stored_token_bytes,
        sft=result.sft_counts,
    )  # fmt: skip
