"""The merge phase: finished work units to shards, rejects.jsonl and index.json, in parallel.

The one-command run appends every unit's frames to the shards in one process, which caps how many
workers it can keep up with. Shard boundaries, though, depend only on the frames' stored sizes
(shard_plan's rule), and every unit's marker holds its frame table: one cheap pass in unit order
plans every shard's frame range and keeps the record accounting, then the shards are written as
independent tasks. Each task appends the same frames through the same writer as the one-command
run does, so the bytes are identical whatever ran the tasks.

The tasks (merge_tasks.py) take and return only small, picklable, JSON-like values, so a process
pool or a distributed engine can run them: `map_tasks(fn, items)` runs the top-level `fn` over
`items` and returns the results in order.

The cheap pass checks markers and sizes, not crc32s (reading the whole work folder, remotely a
download, that the shard tasks read again): each task checks the unit files it loads, the driver
sends damaged units back to run-units before index.json (a rerun rewrites published shards).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from shardtok._process import ignore_sigint, mp_context
from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.units import Unit
from shardtok.convert.job.accounting import RecordAccounting
from shardtok.convert.job.failures import EncoderMismatch, UnitFailure, stops
from shardtok.convert.job.merge_tasks import LoadBatch, ShardTask, UnitPart, load_batch, write_shard
from shardtok.convert.job.output_dir import REJECTS_NAME, RejectsFile, remove_stale_shards
from shardtok.convert.job.progress import plural, progress_bar
from shardtok.convert.job.spec import ConvertJob, settings
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.workdir import WorkDir
from shardtok.errors import ShardtokError
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardtok.format.mmidx import token_dtype
from shardtok.format.shard_plan import ShardSettings, shard_is_full
from shardtok.storage.folder import Folder

MapTasks = Callable[[Callable, Sequence], list]

logger = logging.getLogger(__name__)

# Units whose markers one task loads and checks: enough to amortise a task's overhead, few enough
# that the checks spread over every process.
_MAX_LOAD_BATCH = 32


class UnitsNotReadyError(ShardtokError):
    """A unit the merge needs has not been tokenized (or its files are damaged)."""


@dataclass
class MergeResult:
    manifest: Manifest
    rejects_path: str | None  # rejects.jsonl (--on-bad-record skip), else None
    records_read: int
    documents: int
    rejected: dict[str, int]
    sft_counts: dict | None  # SFT conversions: trained/boundary tokens, truncated records
    stored_token_bytes: int  # the shards' bin members (frames), for the compression ratio


def warn(text: str) -> None:
    """The default `note` of the merge: a warning record (the command line shows it)."""
    logger.warning("%s", text)


# -- running tasks -----------------------------------------------------------------------------


class _LocalMap:
    """The default map_tasks: in this process for one job, else a pool of `jobs` processes
    (started on first use, shared by both kinds of task). `tick` is called per result."""

    def __init__(self, jobs: int, start_method: str | None):
        self.jobs = jobs
        self.start_method = start_method
        self.pool: ProcessPoolExecutor | None = None

    def __call__(self, fn: Callable, items: Sequence, tick: Callable[[], None] | None = None):
        if self.jobs <= 1 or len(items) <= 1:
            results = []
            for item in items:
                results.append(fn(item))
                if tick is not None:
                    tick()
            return results
        results = []
        for result in self.start().map(fn, items):
            results.append(result)
            if tick is not None:
                tick()
        return results

    def start(self) -> ProcessPoolExecutor:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                self.jobs, mp_context=mp_context(self.start_method), initializer=ignore_sigint
            )
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


class _ShardBar:
    def __init__(self, total: int, progress: bool | str):
        self._bar = progress_bar(progress, total, "merging", unit="shard") if total else None

    def tick(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- the merge ---------------------------------------------------------------------------------


def _not_ready(workdir: WorkDir, index: int, state: tuple, others: int) -> UnitsNotReadyError:
    name = workdir.unit_name(index)
    why = "is not finished" if state[0] != "damaged" else f"is damaged ({state[1]}; discarded)"
    more = f" ({others} other unit{plural(others)} too)" if others else ""
    return UnitsNotReadyError(
        f"work unit {name} {why}{more}; run `shardtok convert run-units` again, then merge"
    )


def _failure(state: tuple) -> UnitFailure | EncoderMismatch:
    kind = {"UnitFailure": UnitFailure, "EncoderMismatch": EncoderMismatch}[state[1]]
    return kind(**state[2])


def _load_states(workdir, units, job, jobs, map_tasks) -> list[tuple]:
    frame_settings = (job.frame_size, job.compression_level)
    size = max(1, min(_MAX_LOAD_BATCH, -(-len(units) // (4 * max(jobs, 1)))))
    batches = [
        LoadBatch(
            workdir,
            tuple(u.index for u in units[at : at + size]),
            tuple(len(u.pieces) for u in units[at : at + size]),
            job.tokenizer.dtype.name,
            job.sft is not None,
            frame_settings,
            job.on_bad_record == "error",
        )
        for at in range(0, len(units), size)
    ]
    return [state for batch in map_tasks(load_batch, batches) for state in batch]


def merge_units(
    job: ConvertJob,
    files: list[InputFile],
    units: list[Unit],
    workdir: WorkDir,
    *,
    jobs: int = 1,
    map_tasks: MapTasks | None = None,
    note: Callable[[str], None] = warn,
    progress: bool | str = True,
    start_method: str | None = None,
    storage_options: dict | None = None,
) -> MergeResult:
    """Write the dataset of the finished units in `workdir` into `job.output`: the same shards,
    rejects.jsonl and index.json (last) as the one-command run with the same options.

    `map_tasks(fn, items) -> list` runs the tasks (default: `jobs` local processes). Raises
    the input's first bad record or tokenizer mismatch as the one-command run would, or
    UnitsNotReadyError naming the first unit that is missing or damaged (damaged units are
    discarded, so that run-units redoes them).
    """
    local = _LocalMap(jobs, start_method)
    folder = Folder(job.output, storage_options)
    try:
        states = _load_states(workdir, units, job, jobs, map_tasks or local)
        for unit, state in zip(units, states):
            if state[0] == "damaged":
                workdir.discard_unit(unit.index)
        folder.make()
        with ShardAssembly(job, files, units, workdir, folder, note) as assembly:
            tasks = []
            for position, state in enumerate(states):
                if state[0] != "done" and not _stops(job, state):
                    # (A failure that no longer stops the job, the plan having changed, is
                    # unfinished.)
                    others = sum(s[0] != "done" for s in states[position + 1 :])
                    raise _not_ready(workdir, units[position].index, state, others)
                if state[0] == "failed":
                    assembly.add(_failure(state))  # raises what the one-command run raises
                tasks += assembly.add(UnitResult.from_json(state[1].encode()), state[2])
            tasks += assembly.close_last()
            logger.info(
                "merging %d work units into %d shards in %s (%s)",
                len(units), len(tasks), folder.display,
                "an engine's tasks" if map_tasks is not None else f"{jobs} process(es)",
            )  # fmt: skip
            assembly.wrote(_write_shards(tasks, jobs, map_tasks, local, progress))
            return assembly.publish()
    finally:
        local.close()


def _stops(job: ConvertJob, state: tuple) -> bool:
    failure = _failure(state) if state[0] == "failed" else None
    return stops(failure, job.on_bad_record, job.tokenizer.backend)  # as status judges it


class ShardAssembly:
    """Finished units, in input order, to shards: the one path from work units to a dataset.

    `add` takes each unit's outcome in input order and keeps the record accounting (a failure
    that stops the job raises here, as the first bad record of the input); it returns the shard
    tasks its frames complete. A shard's frames are known as soon as their stored sizes fill
    it (shard_plan's rule looks no further), so the one-command run writes each shard while
    later units are still being tokenized, and the merge phase, having every unit, hands all
    the tasks to processes or an engine: the same tasks, hence the same bytes. `wrote` takes
    the tasks' answers (in shard order), `publish` writes rejects.jsonl and index.json last.
    """

    def __init__(self, job, files, units, workdir: WorkDir, folder: Folder, note):
        self.job, self.units, self.workdir, self.folder = job, units, workdir, folder
        # Streamed to a temporary file, published before index.json.
        self.rejects = RejectsFile(folder) if job.on_bad_record == "skip" else None
        self.accounting = RecordAccounting(
            files, units, skip_bad_records=self.rejects is not None, sft=job.sft is not None,
            note=note, write_reject=None if self.rejects is None else self.rejects.write,
        )  # fmt: skip
        self.settings = _shard_settings(job)
        self.results: list[UnitResult] = []
        self._parts: list[UnitPart] = []  # the open shard's, so far
        self._stored = 0  # its frames' stored bytes
        self.stored_token_bytes = 0
        self.shards = 0
        self.entries: list[dict] = []

    def __enter__(self) -> ShardAssembly:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None and self.rejects is not None:
            self.rejects.discard()

    def add(self, outcome, table: list | None = None) -> list[ShardTask]:
        """The next unit's outcome: a UnitResult (`table`: its frame table re-made under this
        job's frame settings, when it was persisted under others), or the failure that stops
        the job (raised)."""
        bases = self.accounting.add(outcome)
        result: UnitResult = outcome
        position = len(self.results)
        self.results.append(result)
        unit = self.units[position]
        rows = result.frames if table is None else table
        paths = tuple(self.accounting.paths(unit))
        checksums = tuple(sorted(result.checksums.items()))
        tasks, first, stored_at = [], 0, 0
        for at, row in enumerate(rows):
            self._stored += row[2]
            self.stored_token_bytes += row[2]
            if shard_is_full(self._stored, self.job.shard_size) or at == len(rows) - 1:
                end = rows[at + 1][0] if at + 1 < len(rows) else result.num_documents
                part = UnitPart(
                    result.index, tuple(tuple(r) for r in rows[first : at + 1]), stored_at,
                    end, paths, tuple(bases), table is not None, checksums,
                )  # fmt: skip
                self._parts.append(part)
                stored_at += sum(r[2] for r in rows[first : at + 1])
                first = at + 1
                if shard_is_full(self._stored, self.job.shard_size):
                    tasks.append(self._close())
        return tasks

    def _close(self) -> ShardTask:
        task = ShardTask(self.folder, self.workdir, self.settings, self.shards, tuple(self._parts))
        self.shards += 1
        self._parts, self._stored = [], 0
        return task

    def close_last(self) -> list[ShardTask]:
        """The last shard, once every unit is in (none when the last unit filled one)."""
        return [self._close()] if self._parts else []

    def wrote(self, answers: list[dict]) -> None:
        """The shard tasks' answers, in shard order (see merge_tasks.write_shard). Units a
        task found damaged go back to run-units; the first in input order is named."""
        damaged: dict[int, str] = {}
        for index, why in (pair for doc in answers for pair in doc.get("damaged", ())):
            damaged.setdefault(index, why)
            self.workdir.discard_unit(index)
        first = next((unit.index for unit in self.units if unit.index in damaged), None)
        if first is not None:
            raise _not_ready(self.workdir, first, ("damaged", damaged[first]), len(damaged) - 1)
        self.entries += answers

    def publish(self) -> MergeResult:
        """rejects.jsonl, then away with stale shards of an earlier longer attempt, then the
        manifest: a folder with an index.json is complete."""
        job, folder, accounting = self.job, self.folder, self.accounting
        manifest = _manifest(job, self.entries, accounting.extra(settings(job, accounting.files)))
        _check_dataset(folder, manifest, self.results)
        rejects_path = None
        if self.rejects is not None:
            rejects_path = str(self.rejects.commit())
        else:
            folder.delete(REJECTS_NAME)
        remove_stale_shards(folder, manifest)
        if folder.is_local:
            manifest.write(Path(folder.location.local_path))  # fsynced
        else:
            for name, data in manifest.files():  # index.compact, then index.json last
                folder.write_bytes(name, data)
        logger.info(
            "wrote %s: %d shards, %s documents, %s tokens",
            folder.display_of(MANIFEST_NAME), len(manifest.shards),
            f"{manifest.num_documents:,}", f"{manifest.num_tokens:,}",
        )  # fmt: skip
        return MergeResult(
            manifest,
            rejects_path,
            accounting.records_read,
            accounting.documents,
            dict(accounting.rejected),
            None if accounting.sft_counts is None else dict(accounting.sft_counts),
            self.stored_token_bytes,
        )


def _shard_settings(job) -> ShardSettings:
    return ShardSettings(
        job.name,
        job.tokenizer.dtype,
        job.tokenizer.vocab_size,
        job.compression_level,
        job.frame_size,
        job.tokenizer.as_metadata(),
        job.sft is not None,
    )


def _write_shards(tasks: list[ShardTask], jobs, map_tasks, local, progress) -> list[dict]:
    """Every shard, as tasks; their answers (see write_shard)."""
    if map_tasks is None and jobs > 1 and len(tasks) > 1:
        local.start()  # before the bar starts tqdm's monitor thread: forking is safe then
    bar = _ShardBar(len(tasks), progress)
    try:
        if map_tasks is None:
            docs = local(write_shard, tasks, bar.tick)
        else:
            docs = map_tasks(write_shard, tasks)
            bar.tick(len(docs))
    finally:
        bar.close()
    return docs


def _manifest(job, docs: list[dict], extra: dict) -> Manifest:
    """The manifest that lists the shards (not written yet)."""
    shard = _shard_settings(job)
    return Manifest(
        shard.name,
        token_dtype(shard.dtype),
        shard.vocab_size,
        dict(shard.tokenizer),
        tuple(ShardEntry(**doc) for doc in docs),
        extra,
        None if job.sft is None else dict(job.sft.metadata or {}),
    )


def _check_dataset(folder: Folder, manifest: Manifest, results: list[UnitResult]) -> None:
    """The last word before index.json: the manifest must read back by the readers' own rule,
    and the shards must hold exactly the units' documents and tokens. Every input to the merge
    is checked where it is read; this is what keeps whatever slipped past from becoming a
    dataset that `shardtok verify` fails or that silently lacks documents."""
    where = folder.display_of(MANIFEST_NAME)
    try:
        Manifest.from_bytes(manifest.to_bytes(), where)
    except ShardtokError as exc:
        raise ShardtokError(f"the merge would write an unreadable dataset: {exc}") from None
    want = (sum(r.num_documents for r in results), sum(r.num_tokens for r in results))
    got = (manifest.num_documents, manifest.num_tokens)
    if got != want:
        raise ShardtokError(
            f"{where}: not written: the shards hold {got[0]:,} documents and {got[1]:,} tokens, "
            f"the work units {want[0]:,} and {want[1]:,}; run `shardtok convert merge` again"
        )
