"""The conversion job: plan units, tokenize them in a process pool, assemble shards in order.

Workers tokenize units in any order and persist each one in the work folder, together with its
documents cut into frames and compressed (a frame never spans two units, so a worker can do this
alone). The main process assembles: as soon as unit k and every unit before it are finished, it
appends unit k's frames to the DatasetWriter's shards while the workers keep tokenizing later
units. Compression thus scales with the workers instead of competing with them for a core.

Because units reach the writer in input order whatever finished first, the shards are
byte-identical for any worker count and any restart; the unit size moves frame boundaries, never
documents or tokens. After a kill, finished units are reused and the shards are simply written
again from unit 0: shard boundaries are only known by replaying the units, and appending frames
costs little (see docs/CONVERT.md), so rewriting is cheaper and safer than trusting
half-finished output.

The planning (inputs, checks, unit size, the plan file, the state of the output folder) is
shared with the phases (`shardtok convert plan | run-units | status | merge`, and the dask
engine): :func:`open_job` and :func:`plan_job`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok._threads import beside
from shardtok.convert.assembler import Assembler
from shardtok.convert.canary import UnitCanary
from shardtok.convert.failures import EncoderMismatch, UnitFailure
from shardtok.convert.inputs import InputFile, discover
from shardtok.convert.job import (
    TOKENIZER_NAME,
    plan_document,
    same_units,
    settings,
)
from shardtok.convert.output_dir import (
    REJECTS_NAME,
    OutputDirError,
    make_output_folder,
    output_folder,
    prepare_output,
    refuse_file_output,
    remove_stale_shards,
    resolve_output,
)
from shardtok.convert.output_lock import OutputLock, os_error
from shardtok.convert.pool import usable_cores, worker_pool
from shardtok.convert.progress import ConvertProgress, ConvertResult
from shardtok.convert.sft.setup import SFTSetup
from shardtok.convert.tokenizer import TokenizerSpec
from shardtok.convert.unit_feed import UnitFeed
from shardtok.convert.unit_result import UnitResult
from shardtok.convert.units import Unit, auto_unit_size, plan_units
from shardtok.convert.workdir import WorkDir
from shardtok.convert.worker import WorkerConfig
from shardtok.errors import UsageError
from shardtok.format.dataset_writer import DEFAULT_SHARD_SIZE
from shardtok.format.frames import DEFAULT_FRAME_SIZE
from shardtok.format.manifest import Manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage.folder import Folder
from shardtok.storage.location import Location, is_local
from shardtok.storage.source import exists, open_source

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertOptions:
    inputs: tuple[str, ...]
    output: str
    tokenizer: TokenizerSpec
    text_key: str = "text"
    txt_mode: str = "file"  # "file": one document per .txt file; "lines": one per line
    workers: int = 0  # 0 = the cores this process may run on
    on_bad_record: str = "error"  # or "skip"
    shard_size: int = DEFAULT_SHARD_SIZE
    compression_level: int | None = 3  # None = uncompressed .bin members
    frame_size: int = DEFAULT_FRAME_SIZE  # uncompressed token bytes per zstd frame
    unit_size: int | None = None  # None = auto_unit_size(total input bytes)
    name: str = "shard"
    overwrite: bool = False
    keep_work: bool = False
    progress: bool | str = True  # True ("auto"), "always" or False ("never"): see progress.py
    start_method: str | None = None  # workers: None = fork on Linux, spawn elsewhere
    # Fine-tuning records (see shardtok.convert.sft.setup.prepare_sft); None: text documents.
    sft: SFTSetup | None = None
    # fsspec options for a remote output folder and remote inputs (credentials, endpoint);
    # never written to the plan.
    storage_options: dict | None = None


@dataclass
class Planned:
    """A planned job: what every phase works from. `done` is the finished dataset of this very
    job, when the output already holds it (then `units` is empty and nothing was written)."""

    opts: ConvertOptions  # output resolved
    files: list[InputFile]
    units: list[Unit]
    unit_size: int
    settings: dict
    workdir: WorkDir
    done: Manifest | None = None


def check_sft(opts: ConvertOptions, files: list[InputFile]) -> None:
    """SFT records are JSON objects, and the template alone decides BOS/EOS."""
    if opts.sft is None:
        return
    if opts.tokenizer.append_eos or opts.tokenizer.prepend_bos:
        raise UsageError(
            "--append-eos/--prepend-bos do not apply with --sft: the chat template decides BOS/EOS"
        )
    text = [f.path for f in files if f.kind == "txt"]
    if text:
        raise UsageError(
            f"{text[0]}: --sft reads JSONL or Parquet records, not plain text (.txt) files"
        )


@contextlib.contextmanager
def open_job(
    opts: ConvertOptions, *, remote: bool = False
) -> Iterator[tuple[ConvertOptions, list[InputFile]]]:
    """The checks before any work, then the output folder held for this job: yields the options
    with the output resolved, and the input files. A local output is locked (a second
    conversion into it is refused) and an OS error is one line naming the path. `remote`: the
    output may be an object store (the phases), where nothing can lock it."""
    if remote and not is_local(opts.output):
        folder = output_folder(opts.output, opts.storage_options)
        try:
            files = discover(list(opts.inputs), opts.output, opts.storage_options)
            check_sft(opts, files)
            yield opts, files
        except OSError as exc:
            raise os_error(exc, folder.display) from exc
        return
    opts = dataclasses.replace(opts, output=resolve_output(opts.output))
    out = Path(opts.output)
    try:
        refuse_file_output(out)
        files = discover(list(opts.inputs), opts.output, opts.storage_options)
        check_sft(opts, files)
        make_output_folder(out)
        with OutputLock(out):
            yield opts, files
    except OSError as exc:
        raise os_error(exc, out) from exc


def plan_job(
    opts: ConvertOptions,
    files: list[InputFile],
    default_unit_size: Callable[[int], int] = auto_unit_size,
    *,
    tokenizer_file: bool = True,
) -> Planned:
    """Cut the inputs into units and get the output folder ready: a fresh work folder with
    plan.json and tokenizer.json, or the one of an earlier run of the same units (kept, with
    its finished units, and its plan updated to these options), or the finished dataset.
    Call it inside :func:`open_job`. `tokenizer_file=False` leaves tokenizer.json to the
    caller (:func:`write_tokenizer_file`), who must write it before the work is done."""
    folder = Folder(opts.output, opts.storage_options)
    unit_size = opts.unit_size or default_unit_size(sum(f.size for f in files))
    job_settings = settings(opts, files, unit_size)
    units = plan_units(files, unit_size, opts.txt_mode, opts.storage_options)
    doc = plan_document(opts, files, units, unit_size)
    workdir = WorkDir(folder)
    existing = workdir.read_plan() if not opts.overwrite else None
    if same_units(existing, doc) and existing != doc:
        # Same units, other merge options (shard size, bad-record mode...): the finished units
        # stay, the plan takes the new options.
        workdir.write_plan(doc)
    workdir, done = prepare_output(folder, opts.name, doc, job_settings, opts.overwrite)
    if done is not None:
        if done.tokenizer != opts.tokenizer.as_metadata():
            # The settings compared above leave the tokenizer out: without this, a dataset of
            # another tokenizer or EOS/BOS would pass for this job's, and the summary would name
            # ids that are not in it.
            raise OutputDirError(
                f"{folder.display} already holds a dataset converted with another tokenizer or "
                f"EOS/BOS ({_tokenizer_text(done.tokenizer)}; this run: "
                f"{_tokenizer_text(opts.tokenizer.as_metadata())}); pass --overwrite to replace "
                "it, or choose another --output"
            )
        return Planned(opts, files, [], unit_size, job_settings, workdir, done)
    if tokenizer_file:
        write_tokenizer_file(workdir, opts.tokenizer)
    return Planned(opts, files, units, unit_size, job_settings, workdir)


def write_tokenizer_file(workdir: WorkDir, spec: TokenizerSpec) -> None:
    """tokenizer.json in the work folder, where the phases read the job's tokenizer from,
    unless it is there already. After plan.json (which starts a fresh work folder): a plan
    whose tokenizer.json is missing is refused by the phases, and planning again writes it."""
    backend = spec.backend_json.encode("utf-8")
    if _read_or_none(workdir, TOKENIZER_NAME) != backend:
        workdir.write_file(TOKENIZER_NAME, backend)


def _tokenizer_text(meta: dict) -> str:
    return f"{meta.get('name')}, eos_id {meta.get('eos_id')}, bos_id {meta.get('bos_id')}"


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


def _read_or_none(workdir: WorkDir, name: str) -> bytes | None:
    try:
        return workdir.read_file(name)
    except FileNotFoundError:
        return None


def stored_token_bytes(output: str, manifest: Manifest, storage_options: dict | None = None):
    """Bytes of the shards' bin members, read from each shard's json (the head of the tar)."""
    where = Location.of(output)
    total = 0
    for shard in manifest.shards:
        with open_source(where.join(shard.file), storage_options) as source:
            total += sum(f.compressed_size for f in ShardReader(source).meta.frames)
    return total


def finished_result(output: str, done: Manifest, storage_options: dict | None = None):
    """The result for an output that already holds this job's dataset (nothing to do)."""
    extra = done.extra
    rejects = Location.of(output).join(REJECTS_NAME)
    return ConvertResult(
        output, done, extra.get("records_read", 0), extra.get("documents_written", 0),
        dict(extra.get("rejected_by_reason", {})), already_complete=True,
        # (display: a URL's credentials are never printed)
        rejects_path=rejects.display if exists(rejects, storage_options) else None,
        stored_token_bytes=stored_token_bytes(output, done, storage_options),
        sft=extra.get("sft_stats"),
    )  # fmt: skip


def worker_config(opts: ConvertOptions, files) -> WorkerConfig:
    return WorkerConfig(
        tuple(files),
        str(opts.output),
        opts.text_key,
        opts.txt_mode,
        opts.on_bad_record == "error",
        opts.tokenizer,
        opts.frame_size,
        opts.compression_level,
        opts.sft,
        opts.storage_options,
    )


def convert(opts: ConvertOptions) -> ConvertResult:
    """Run (or resume, or recognise as done) the conversion described by `opts`.

    One conversion at a time per output folder (OutputInUseError for the second); an OS error
    (disk full, permissions) is an OutputIOError naming the path.
    """
    started = time.monotonic()
    with open_job(opts) as (opts, files):
        planned = plan_job(opts, files, tokenizer_file=False)
        if planned.done is not None:
            return finished_result(opts.output, planned.done)
        return _convert(planned, started)


def _convert(planned: Planned, started: float) -> ConvertResult:
    opts, files, units, workdir = planned.opts, planned.files, planned.units, planned.workdir
    out = Path(opts.output)
    dtype = opts.tokenizer.dtype
    ready: dict[int, UnitResult | UnitFailure | EncoderMismatch | Exception] = {}
    for unit in units:
        previous, warning = reusable_unit(workdir, unit, dtype, opts.sft is not None)
        if warning is not None:
            logger.warning("%s", warning)
        if previous is not None:
            ready[unit.index] = previous
    reused = len(ready)
    todo = [u for u in units if u.index not in ready]

    workers = max(1, min(opts.workers or usable_cores(), len(todo) or 1))
    progress = assembler = None
    with contextlib.ExitStack() as stack:
        pool = None
        if todo:
            pool = stack.enter_context(
                worker_pool(worker_config(opts, files), workers, opts.start_method)
            )
        tokenizer_file = stack.enter_context(contextlib.ExitStack())
        try:
            # Each unit's canary is checked here before it is sent (canary.py): ~0.4 ms of this
            # process per unit instead of a stall of the worker's tokenizing thread.
            canary = UnitCanary.for_job(
                opts.tokenizer, files, opts.text_key, opts.txt_mode, opts.sft
            )
            feed = UnitFeed(pool, todo, canary, workers)
            feed.top_up()
            pending = feed.pending
            # tokenizer.json (9 MB for Llama 3, 5-15 ms to encode and write) only matters to the
            # phases after a kill: written beside the units instead of before the first one,
            # once the workers are forked (no thread may run here before) and have their first
            # units, and awaited before the shards are finished.
            tokenizer_file.enter_context(
                beside(
                    "shardtok-tokenizer-file",
                    lambda: write_tokenizer_file(workdir, opts.tokenizer),
                )
            )
            progress = ConvertProgress(sum(f.size for f in files), opts.progress)
            for result in ready.values():
                progress.unit_done(
                    result.input_bytes, result.num_documents, result.num_tokens, reused=True
                )
            assembler = Assembler(opts, files, units, workdir, progress.note)
            for next_index in range(len(units)):
                while next_index not in ready:
                    feed.top_up()
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        index = pending.pop(future)
                        try:
                            result = future.result()
                        except Exception as exc:  # raised in unit order below, like bad records
                            result = exc
                        ready[index] = result
                        if isinstance(result, UnitResult):
                            progress.unit_done(
                                result.input_bytes, result.num_documents, result.num_tokens, False
                            )
                        else:
                            feed.stop_after(index)  # the run will stop at this unit
                if pool is not None and feed.all_in:
                    pool.retire()  # every unit is in: the workers exit beside the assembly
                result = ready.pop(next_index)
                if isinstance(result, Exception):
                    raise result
                assembler.add(result)
            tokenizer_file.close()
            manifest, rejects_path = assembler.finish(planned.settings)
        except BaseException:
            if assembler is not None:
                assembler.abandon()
            raise
        finally:
            if progress is not None:
                progress.close()
        # Still in the pool's block, whose end waits for the retired workers to exit (~8 ms:
        # a forked worker unmaps its share of this process's memory): the tidying overlaps it.
        # The workers are done with the work folder: every unit's outcome is in.
        remove_stale_shards(out, manifest)
        if not opts.keep_work:
            workdir.remove()
    return ConvertResult(
        str(out), manifest, assembler.records_read, assembler.documents, dict(assembler.rejected),
        units_total=len(units), units_reused=reused, units_tokenized=len(todo),
        seconds=time.monotonic() - started,
        rejects_path=str(rejects_path) if rejects_path else None,
        tokenizer_backend=opts.tokenizer.backend,
        tokenizer_backend_note=opts.tokenizer.backend_note,
        # Known from the shards just written: reading every shard's head back cost ~1 ms
        # (one open per shard) after the dataset was complete.
        stored_token_bytes=assembler.writer.stored_token_bytes,
        sft=None if opts.sft is None else dict(assembler.sft_counts),
    )  # fmt: skip
