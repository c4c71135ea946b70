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
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from shardtok.convert.assembler import Assembler
from shardtok.convert.inputs import InputFile, discover
from shardtok.convert.output_dir import (
    make_output_folder,
    prepare_output,
    refuse_file_output,
    remove_stale_shards,
    resolve_output,
)
from shardtok.convert.output_lock import OutputLock, os_error
from shardtok.convert.progress import ConvertProgress, ConvertResult
from shardtok.convert.sft.setup import SFTSetup
from shardtok.convert.tokenizer import TokenizerSpec
from shardtok.convert.units import auto_unit_size, plan_units
from shardtok.convert.workdir import UnitResult
from shardtok.convert.worker import (
    EncoderMismatch,
    UnitFailure,
    WorkerConfig,
    init_worker,
    tokenize_unit,
)
from shardtok.errors import UsageError
from shardtok.format.dataset_writer import DEFAULT_SHARD_SIZE
from shardtok.format.frames import DEFAULT_FRAME_SIZE
from shardtok.format.manifest import Manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage.source import open_source

_PLAN_FORMAT = 1


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
    progress: bool = True
    start_method: str | None = None  # workers: None = fork on Linux, spawn elsewhere
    # Fine-tuning records (see shardtok.convert.sft.setup.prepare_sft); None: text documents.
    sft: SFTSetup | None = None


def _settings(opts: ConvertOptions, files: list[InputFile], unit_size: int) -> dict:
    """The conversion's settings as stored in the manifest (deterministic: no times, no workers)."""
    settings = {
        "unit_size": unit_size,  # frames end at unit ends
        "inputs": [{"path": f.path, "bytes": f.size} for f in files],
        "text_key": opts.text_key,
        "txt_mode": opts.txt_mode,
        "append_eos": opts.tokenizer.append_eos,
        "prepend_bos": opts.tokenizer.prepend_bos,
        "on_bad_record": opts.on_bad_record,
        "shard_size": opts.shard_size,
        "compression_level": opts.compression_level,
        "frame_size": opts.frame_size,
    }
    if opts.sft is not None:  # only then: plain conversions keep their settings (and bytes)
        settings["sft"] = opts.sft.metadata
    return settings


def _plan(opts: ConvertOptions, files: list[InputFile], unit_size: int) -> dict:
    """Everything that decides a unit's persisted content; work is reused only under an equal plan.

    --on-bad-record is left out on purpose: a unit persisted under `error` had no rejects, and a
    unit persisted under `skip` records its rejects, so either mode can reuse the other's units.
    """
    spec = opts.tokenizer
    plan = {
        "format": _PLAN_FORMAT,
        "inputs": [[f.path, f.kind, f.compression, f.size, f.mtime_ns] for f in files],
        "text_key": opts.text_key,
        "txt_mode": opts.txt_mode,
        "tokenizer": spec.fingerprint,
        "vocab_size": spec.vocab_size,
        "eos_id": spec.eos_id if spec.append_eos else None,
        "bos_id": spec.bos_id if spec.prepend_bos else None,
        "unit_size": unit_size,
    }
    if opts.sft is not None:
        plan["sft"] = opts.sft.metadata
    return plan


def _check_sft(opts: ConvertOptions, files: list[InputFile]) -> None:
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


def _stored_token_bytes(out: Path, manifest: Manifest) -> int:
    """Bytes of the shards' bin members, read from each shard's json (the head of the tar)."""
    return sum(
        sum(f.compressed_size for f in ShardReader(open_source(out / shard.file)).meta.frames)
        for shard in manifest.shards
    )


def _usable_cores() -> int:
    """Cores this process may use (a container's CPU set, not the host's core count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _mp_context(start_method: str | None):
    """fork where it is safe and cheap (Linux), spawn elsewhere (macOS, Windows)."""
    if start_method is not None:
        return multiprocessing.get_context(start_method)
    if sys.platform == "linux":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def convert(opts: ConvertOptions) -> ConvertResult:
    """Run (or resume, or recognise as done) the conversion described by `opts`.

    One conversion at a time per output folder (OutputInUseError for the second); an OS error
    (disk full, permissions) is an OutputIOError naming the path.
    """
    started = time.monotonic()
    opts = dataclasses.replace(opts, output=resolve_output(opts.output))
    out = Path(opts.output)
    try:
        refuse_file_output(out)
        files = discover(list(opts.inputs), exclude_dir=opts.output)
        _check_sft(opts, files)
        make_output_folder(out)
        with OutputLock(out):
            return _convert(opts, files, out, started)
    except OSError as exc:
        raise os_error(exc, out) from exc


def _convert(
    opts: ConvertOptions, files: list[InputFile], out: Path, started: float
) -> ConvertResult:
    total_bytes = sum(f.size for f in files)
    unit_size = opts.unit_size or auto_unit_size(total_bytes)
    settings = _settings(opts, files, unit_size)
    workdir, done = prepare_output(
        out, opts.name, _plan(opts, files, unit_size), settings, opts.overwrite
    )
    if done is not None:
        extra = done.extra
        rejects = out / "rejects.jsonl"
        return ConvertResult(
            str(out), done, extra.get("records_read", 0), extra.get("documents_written", 0),
            dict(extra.get("rejected_by_reason", {})), already_complete=True,
            rejects_path=str(rejects) if rejects.exists() else None,
            stored_token_bytes=_stored_token_bytes(out, done), sft=extra.get("sft_stats"),
        )  # fmt: skip

    units = plan_units(files, unit_size, opts.txt_mode)
    dtype = opts.tokenizer.dtype
    ready: dict[int, UnitResult | UnitFailure | EncoderMismatch | Exception] = {}
    for unit in units:
        previous = workdir.load_result(unit.index, dtype, masks=opts.sft is not None)
        if isinstance(previous, str):
            # Redoing it gives the same bytes, so the output stays identical to a clean run.
            print(
                f"warning: work unit {workdir.unit_name(unit.index)} is damaged ({previous}); "
                "tokenizing it again",
                file=sys.stderr,
            )
            workdir.discard_unit(unit.index)
        elif previous is not None:
            ready[unit.index] = previous
    reused = len(ready)
    todo = [u for u in units if u.index not in ready]

    config = WorkerConfig(
        tuple(files),
        str(out),
        opts.text_key,
        opts.txt_mode,
        opts.on_bad_record == "error",
        opts.tokenizer,
        opts.frame_size,
        opts.compression_level,
        opts.sft,
    )
    workers = max(1, min(opts.workers or _usable_cores(), len(todo) or 1))
    pool = None
    progress = assembler = None
    context = _mp_context(opts.start_method)
    # Workers watch this pipe: it reaches EOF when this process dies, however it dies (see
    # worker.py). This process only ever holds the write end; it is never written.
    alive_r, alive_w = context.Pipe(duplex=False)
    try:
        if todo:
            # Workers are started before anything here starts a thread (tqdm's monitor), so
            # forking is safe; fork also spares each worker re-importing and unpickling.
            pool = ProcessPoolExecutor(
                workers,
                mp_context=context,
                initializer=init_worker,
                initargs=(config, alive_r, alive_w),
            )
        pending: dict[Future, int] = (
            {pool.submit(tokenize_unit, u): u.index for u in todo} if pool else {}
        )
        progress = ConvertProgress(total_bytes, opts.progress)
        for result in ready.values():
            progress.unit_done(
                result.input_bytes, result.num_documents, result.num_tokens, reused=True
            )
        assembler = Assembler(opts, files, units, workdir, progress.note)
        for next_index in range(len(units)):
            while next_index not in ready:
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
                        # The run will stop at this unit: later units are wasted work.
                        for other in [f for f, i in pending.items() if i > index]:
                            if other.cancel():
                                del pending[other]
            result = ready.pop(next_index)
            if isinstance(result, Exception):
                raise result
            assembler.add(result)
        manifest, rejects_path = assembler.finish(settings)
    except BaseException:
        if assembler is not None:
            assembler.abandon()
        raise
    finally:
        if progress is not None:
            progress.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        alive_r.close()
        alive_w.close()

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
        stored_token_bytes=_stored_token_bytes(out, manifest),
        sft=None if opts.sft is None else dict(assembler.sft_counts),
    )  # fmt: skip
