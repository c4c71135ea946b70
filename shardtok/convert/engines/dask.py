"""Every phase of a conversion on a dask cluster: ``shardtok convert ... --engine dask``.

The driver (this process) plans, then sends one task per unit still to do, whose arguments are
only the output, the storage options and the unit's index: each worker process parses the job
from the plan in the work folder once (the tokenizer travels there too; see run_unit), so
nothing big crosses the network per task. Tasks may run anywhere, twice, or
die halfway (a lost worker's task is rerun elsewhere): a unit's files are deterministic and its
marker is written last. A unit that stops the conversion ends the submitting; the merge then
reports it exactly as the one-command run would, else writes the shards as cluster tasks too.
The bytes are those of ``shardtok convert ... --workers 1`` with the same unit size.

Without a scheduler address a LocalCluster of worker processes on this machine runs the tasks,
started in a helper process (local_cluster.py) so that its writes to the environment never
reach the caller's.
dask is optional: importing this module does not import it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence

from shardtok._process import usable_cores
from shardtok.convert.engines.local import (
    finished_result,
    open_job,
    plan_job,
    reusable_unit,
)
from shardtok.convert.engines.local_cluster import local_cluster
from shardtok.convert.job.phases import merge_job, worker_config
from shardtok.convert.job.plan_file import load_plan, plan_bytes
from shardtok.convert.job.progress import ConvertProgress, ConvertResult
from shardtok.convert.job.spec import ConvertJob, Plan, RunOptions, distributed_unit_size
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.unit_status import pending_units
from shardtok.convert.job.workdir import WorkDir, unit_base
from shardtok.convert.worker.process import init_worker, tokenize_unit
from shardtok.errors import ShardtokError, UsageError
from shardtok.storage.location import is_local

# Tasks in flight per worker thread: enough that no worker waits for the driver, few enough
# that a failure stops the submitting early.
_IN_FLIGHT_PER_THREAD = 2


def require_dask():
    """The distributed package, or a one-line UsageError saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise UsageError(
            "--engine dask needs dask's distributed scheduler: pip install 'shardtok[dask]'"
        ) from None
    return distributed


def convert_with_dask(
    job: ConvertJob, run: RunOptions | None = None, scheduler: str | None = None
) -> ConvertResult:
    """Run (or resume, or recognise as done) the conversion `job` on a dask cluster: the one
    at `scheduler` (``tcp://HOST:PORT``), else a LocalCluster of `run.workers` processes
    (default: every core) started here and closed at the end. The output may be an
    object store; a local one is locked for the whole run, as by the one-command convert."""
    distributed = require_dask()
    started = time.monotonic()
    run = run or RunOptions()
    options = run.storage_options
    with open_job(job, run, remote=True) as (job, files):
        planned = plan_job(job, files, run, distributed_unit_size)
        if planned.done is not None:
            return finished_result(job.output, planned.done, options)
        workdir = planned.workdir
        plan = load_plan(workdir)  # as every task reads it
        pending = pending_units(plan, workdir, range(len(plan.units)))
        with contextlib.ExitStack() as stack:
            if scheduler is None:
                scheduler = stack.enter_context(local_cluster(run.workers or usable_cores()))
            client = stack.enter_context(_connect(distributed, scheduler))
            bar = ConvertProgress(sum(u.nbytes for u in plan.units), run.progress)
            stack.callback(bar.close)
            for warning in pending.warnings:
                bar.note(warning)
            for result in pending.kept:
                bar.unit_done(result.input_bytes, result.num_documents, result.num_tokens, True)
            # Workers elsewhere have another working directory: a local output goes to them
            # as an absolute path (a shared file system), for the units and the shards.
            where = os.path.abspath(job.output) if is_local(job.output) else job.output
            todo = [u.index for u in pending.todo]
            _tokenize(distributed, client, where, options, todo, bar)
            bar.close()
            result = merge_job(
                plan, WorkDir(where, options), where, options,
                map_tasks=_map_tasks(client), progress=run.progress, keep_work=run.keep_work,
            )  # fmt: skip
    result.output = workdir.output.display  # as given, like the one-command convert says it
    result.units_reused = len(pending.kept)
    result.units_tokenized = len(pending.todo)
    result.seconds = time.monotonic() - started
    result.tokenizer_backend = job.tokenizer.backend
    result.tokenizer_backend_note = job.tokenizer.backend_note
    return result


# -- the task: one unit, in a worker process ---------------------------------------------------

_ENGINE_LOCK = threading.Lock()
_ENGINE_PLANS: dict[str, Plan] = {}  # by plan digest
_ENGINE_STATE: dict[str, tuple | None] = {"built_for": None}


def run_unit(output: str, storage_options: dict | None, index: int) -> tuple:
    """An engine's task for unit `index`, in any process, any number of times: the job comes
    from the plan in `output`. Returns (index, input bytes, documents, tokens, whether the unit
    stops the conversion, a warning or None)."""
    with _ENGINE_LOCK:  # the worker module's state serves one unit at a time
        plan, workdir = _engine_plan(output, storage_options)
        if index >= len(plan.units):
            raise ShardtokError(
                f"{workdir.output.display} was planned again while the conversion ran (work "
                f"unit {index} is not in its plan now); run the command again"
            )
        unit, job = plan.units[index], plan.job
        result = warning = None
        if workdir.folder.exists(unit_base(index) + ".json"):  # a requeued task, or a rerun
            result, warning = reusable_unit(
                workdir, unit, job.tokenizer.dtype, job.sft is not None, verify=False
            )
        if result is None:
            result = tokenize_unit(unit)
    if isinstance(result, UnitResult):
        return index, result.input_bytes, result.num_documents, result.num_tokens, False, warning
    return index, unit.nbytes, 0, 0, True, warning


def _engine_plan(output: str, storage_options: dict | None) -> tuple[Plan, WorkDir]:
    """The plan in `output`, parsed once per process and plan, with this process's
    worker state built for it. The plan is read again for every task (a small share of a
    unit's input) so that a later conversion into the same output, on the same long-lived
    engine worker, never gets an earlier one's job."""
    workdir = WorkDir(output, storage_options)
    data = plan_bytes(workdir)
    digest = hashlib.sha256(data).hexdigest()
    plan = _ENGINE_PLANS.get(digest)
    if plan is None:
        plan = load_plan(workdir, data)
        _ENGINE_PLANS.clear()  # one plan at a time is the common case: keep memory flat
        _ENGINE_PLANS[digest] = plan
    key = (digest, output, repr(sorted((storage_options or {}).items())))
    if _ENGINE_STATE["built_for"] != key:
        init_worker(worker_config(plan, output, storage_options))  # dask ends its workers
        _ENGINE_STATE["built_for"] = key
    return plan, workdir


def _connect(distributed, scheduler: str):
    try:
        return distributed.Client(scheduler)
    except (OSError, ValueError) as exc:  # timeouts are OSErrors: not the output's fault
        raise UsageError(f"--scheduler {scheduler}: cannot connect ({exc})") from None


def _tokenize(
    distributed, client, output: str, storage_options: dict | None, todo: list[int], bar
) -> None:
    """Run the units `todo` as tasks, in index order, until done or one stops the conversion
    (then nothing after it is submitted, and what runs after it is cancelled)."""
    threads = sum(client.nthreads().values()) or 1
    window = max(4, threads * _IN_FLIGHT_PER_THREAD)
    queue = list(reversed(todo))
    running = distributed.as_completed()
    index_of = {}
    stop_at = None

    def submit() -> None:
        while queue and len(index_of) < window:
            index = queue.pop()
            if stop_at is not None and index > stop_at:
                continue
            # pure=False: a rerun after a crash must run again, not find a cached result.
            future = client.submit(run_unit, output, storage_options, index, pure=False)
            index_of[future] = index
            running.add(future)

    submit()
    try:
        for future in running:
            if future not in index_of:  # cancelled
                continue
            index = index_of.pop(future)
            try:
                _, nbytes, documents, tokens, stops, warning = future.result()
            except distributed.KilledWorker as exc:
                raise ShardtokError(
                    f"work unit {index}: every dask worker that ran it died ({exc}); finished "
                    "units are kept, so running the same command again resumes"
                ) from None
            if warning:
                bar.note(warning)
            if stops:
                stop_at = index if stop_at is None else min(stop_at, index)
                later = [f for f, i in index_of.items() if i > stop_at]
                for f in later:
                    del index_of[f]
                client.cancel(later)
            else:
                bar.unit_done(nbytes, documents, tokens, False)
            submit()
    except BaseException:
        client.cancel(list(index_of))
        raise


def _map_tasks(client) -> Callable[[Callable, Sequence], list]:
    """merge_units' map_tasks on the cluster: results in the order of `items`."""

    def map_tasks(fn: Callable, items: Sequence) -> list:
        if not items:
            return []
        futures = client.map(fn, list(items), pure=False)
        return client.gather(futures)

    return map_tasks
