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

import bisect
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok.convert.accounting import RecordAccounting
from shardtok.convert.failures import EncoderMismatch, UnitFailure, stops
from shardtok.convert.inputs import InputFile
from shardtok.convert.merge_tasks import LoadBatch, ShardTask, UnitPart, load_batch, write_shard
from shardtok.convert.output_dir import REJECTS_NAME, RejectsFile, remove_stale_shards
from shardtok.convert.pool import mp_context
from shardtok.convert.progress import plural, progress_bar
from shardtok.convert.unit_result import UnitResult
from shardtok.convert.units import Unit
from shardtok.convert.workdir import WorkDir
from shardtok.convert.worker import ignore_sigint
from shardtok.errors import ShardtokError
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardtok.format.mmidx import token_dtype
from shardtok.format.shard_plan import ShardSettings, plan_shards
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


def _load_states(workdir, units, opts, jobs, map_tasks) -> list[tuple]:
    frame_settings = (opts.frame_size, opts.compression_level)
    size = max(1, min(_MAX_LOAD_BATCH, -(-len(units) // (4 * max(jobs, 1)))))
    batches = [
        LoadBatch(
            workdir,
            tuple(u.index for u in units[at : at + size]),
            tuple(len(u.pieces) for u in units[at : at + size]),
            opts.tokenizer.dtype.name,
            opts.sft is not None,
            frame_settings,
            opts.on_bad_record == "error",
        )
        for at in range(0, len(units), size)
    ]
    return [state for batch in map_tasks(load_batch, batches) for state in batch]


def merge_units(
    opts,
    files: list[InputFile],
    units: list[Unit],
    workdir: WorkDir,
    settings: dict,
    *,
    jobs: int = 1,
    map_tasks: MapTasks | None = None,
    note: Callable[[str], None] = warn,
    progress: bool = True,
) -> MergeResult:
    """Write the dataset of the finished units in `workdir` into `opts.output`: the same shards,
    rejects.jsonl and index.json (last) as the one-command run with the same options.

    `settings` are the manifest's convert settings. `map_tasks(fn, items) -> list` runs the
    tasks (default: `jobs` local processes). Raises the input's first bad record or tokenizer
    mismatch as the one-command run would, or UnitsNotReadyError naming the first unit that is
    missing or damaged (damaged units are discarded, so that run-units redoes them).
    """
    local = _LocalMap(jobs, opts.start_method)
    try:
        return _merge(opts, files, units, workdir, settings, jobs, map_tasks, local, note, progress)
    finally:
        local.close()


@dataclass
class _Ledger:
    """The cheap pass over the units in input order."""

    accounting: RecordAccounting
    results: list[UnitResult]
    bases: list[list[int]]  # each unit's record base per piece
    tables: list[list]  # each unit's frame table under this run's frame settings
    reframed: list[bool]  # whether that table was re-made (other frame settings)


def _account(opts, files, units, workdir, states, note, rejects) -> _Ledger:
    skip = opts.on_bad_record == "skip"
    accounting = RecordAccounting(
        files, units, skip_bad_records=skip, sft=opts.sft is not None, note=note,
        write_reject=None if rejects is None else rejects.write,
    )  # fmt: skip
    ledger = _Ledger(accounting, [], [], [], [])
    for position, (unit, state) in enumerate(zip(units, states)):
        failure = _failure(state) if state[0] == "failed" else None
        if stops(failure, opts.on_bad_record, opts.tokenizer.backend):  # as status judges it
            accounting.add(failure)  # raises what the one-command run raises here
        if state[0] != "done":
            # (A failure that no longer stops the job, the plan having changed, is unfinished.)
            others = sum(s[0] != "done" for s in states[position + 1 :])
            raise _not_ready(workdir, unit.index, state, others)
        result = UnitResult.from_json(state[1].encode())
        ledger.bases.append(accounting.add(result))
        ledger.results.append(result)
        ledger.tables.append(result.frames if state[2] is None else state[2])
        ledger.reframed.append(state[2] is not None)
    return ledger


def _shard_tasks(ledger: _Ledger, units, folder, workdir, shard, shard_size) -> list[ShardTask]:
    """Every shard's frames, as (unit, frame range) parts, by shard_plan's rule."""
    tables = ledger.tables
    stored_sizes = [row[2] for table in tables for row in table]
    starts = np.cumsum([0] + [len(t) for t in tables]).tolist()  # each unit's first frame
    tasks = []
    for number, (first, end) in enumerate(plan_shards(stored_sizes, shard_size)):
        parts = []
        position = bisect.bisect_right(starts, first) - 1
        while position < len(tables) and starts[position] < end:
            table, result = tables[position], ledger.results[position]
            a = max(first, starts[position]) - starts[position]
            b = min(end, starts[position + 1]) - starts[position]
            if b > a:
                parts.append(
                    UnitPart(
                        result.index,
                        tuple(tuple(row) for row in table[a:b]),
                        sum(row[2] for row in table[:a]),
                        table[b][0] if b < len(table) else result.num_documents,
                        tuple(ledger.accounting.paths(units[position])),
                        tuple(ledger.bases[position]),
                        ledger.reframed[position],
                        tuple(sorted(result.checksums.items())),
                    )
                )
            position += 1
        tasks.append(ShardTask(folder, workdir, shard, number, tuple(parts)))
    return tasks


def _merge(opts, files, units, workdir, settings, jobs, map_tasks, local, note, progress):
    folder = Folder(opts.output, opts.storage_options)
    states = _load_states(workdir, units, opts, jobs, map_tasks or local)
    for unit, state in zip(units, states):
        if state[0] == "damaged":
            workdir.discard_unit(unit.index)
    folder.make()
    # Streamed to a temporary file, as by the one-command run, and published before index.json.
    rejects = RejectsFile(folder) if opts.on_bad_record == "skip" else None
    try:
        ledger = _account(opts, files, units, workdir, states, note, rejects)
        tasks = _shard_tasks(ledger, units, folder, workdir, _shard_settings(opts), opts.shard_size)
        logger.info(
            "merging %d work units into %d shards in %s (%s)",
            len(units), len(tasks), folder.display,
            "an engine's tasks" if map_tasks is not None else f"{jobs} process(es)",
        )  # fmt: skip
        docs = _write_shards(tasks, jobs, map_tasks, local, progress)
        _raise_damage(workdir, units, docs)
        manifest = _manifest(opts, docs, ledger.accounting.extra(settings))
        _check_dataset(folder, manifest, ledger)
        rejects_path = _publish(folder, manifest, rejects)
        logger.info(
            "wrote %s: %d shards, %s documents, %s tokens",
            folder.display_of(MANIFEST_NAME), len(manifest.shards),
            f"{manifest.num_documents:,}", f"{manifest.num_tokens:,}",
        )  # fmt: skip
    except BaseException:
        if rejects is not None:
            rejects.discard()
        raise
    accounting = ledger.accounting
    return MergeResult(
        manifest,
        rejects_path,
        accounting.records_read,
        accounting.documents,
        dict(accounting.rejected),
        None if accounting.sft_counts is None else dict(accounting.sft_counts),
        sum(row[2] for table in ledger.tables for row in table),
    )


def _shard_settings(opts) -> ShardSettings:
    return ShardSettings(
        opts.name,
        opts.tokenizer.dtype,
        opts.tokenizer.vocab_size,
        opts.compression_level,
        opts.frame_size,
        opts.tokenizer.as_metadata(),
        opts.sft is not None,
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


def _raise_damage(workdir: WorkDir, units: list[Unit], docs: list[dict]) -> None:
    """Units a shard task found damaged go back to run-units; the first in input order is named."""
    damaged: dict[int, str] = {}
    for index, why in (pair for doc in docs for pair in doc.get("damaged", ())):
        damaged.setdefault(index, why)
        workdir.discard_unit(index)
    first = next((unit.index for unit in units if unit.index in damaged), None)
    if first is not None:
        raise _not_ready(workdir, first, ("damaged", damaged[first]), len(damaged) - 1)


def _manifest(opts, docs: list[dict], extra: dict) -> Manifest:
    """The manifest that lists the shards (not written yet)."""
    shard = _shard_settings(opts)
    return Manifest(
        shard.name,
        token_dtype(shard.dtype),
        shard.vocab_size,
        dict(shard.tokenizer),
        tuple(ShardEntry(**doc) for doc in docs),
        extra,
        None if opts.sft is None else dict(opts.sft.metadata or {}),
    )


def _check_dataset(folder: Folder, manifest: Manifest, ledger: _Ledger) -> None:
    """The last word before index.json: the manifest must read back by the readers' own rule,
    and the shards must hold exactly the units' documents and tokens. Every input to the merge
    is checked where it is read; this is what keeps whatever slipped past from becoming a
    dataset that `shardtok verify` fails or that silently lacks documents."""
    where = folder.display_of(MANIFEST_NAME)
    try:
        Manifest.from_bytes(manifest.to_bytes(), where)
    except ShardtokError as exc:
        raise ShardtokError(f"the merge would write an unreadable dataset: {exc}") from None
    want = (sum(r.num_documents for r in ledger.results), sum(r.num_tokens for r in ledger.results))
    got = (manifest.num_documents, manifest.num_tokens)
    if got != want:
        raise ShardtokError(
            f"{where}: not written: the shards hold {got[0]:,} documents and {got[1]:,} tokens, "
            f"the work units {want[0]:,} and {want[1]:,}; run `shardtok convert merge` again"
        )


def _publish(folder: Folder, manifest: Manifest, rejects: RejectsFile | None) -> str | None:
    """rejects.jsonl, then away with stale shards of an earlier longer attempt, then the
    manifest: a folder with an index.json is complete."""
    rejects_path = None
    if rejects is not None:
        rejects_path = str(rejects.commit())
    else:
        folder.delete(REJECTS_NAME)
    remove_stale_shards(folder, manifest)
    if folder.is_local:
        manifest.write(Path(folder.location.local_path))  # fsynced
    else:
        for name, data in manifest.files():  # index.compact, then index.json last
            folder.write_bytes(name, data)
    return rejects_path
