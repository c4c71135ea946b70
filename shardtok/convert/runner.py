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
import io
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok.convert.inputs import InputFile, discover
from shardtok.convert.output_dir import (
    RejectsFile,
    make_output_folder,
    prepare_output,
    refuse_file_output,
    remove_stale_shards,
    resolve_output,
)
from shardtok.convert.output_lock import OutputLock, os_error
from shardtok.convert.progress import ConvertProgress, ConvertResult
from shardtok.convert.tokenizer import TokenizerSpec
from shardtok.convert.units import Unit, auto_unit_size, plan_units
from shardtok.convert.workdir import UnitResult, WorkDir
from shardtok.convert.worker import (
    EncoderMismatch,
    UnitFailure,
    WorkerConfig,
    init_worker,
    tokenize_unit,
)
from shardtok.errors import BadRecordError, TokenizerMismatchError
from shardtok.format.dataset_writer import DEFAULT_SHARD_SIZE, DatasetWriter
from shardtok.format.frames import DEFAULT_FRAME_SIZE, FrameBuilder
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


def _settings(opts: ConvertOptions, files: list[InputFile], unit_size: int) -> dict:
    """The conversion's settings as stored in the manifest (deterministic: no times, no workers)."""
    return {
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


def _plan(opts: ConvertOptions, files: list[InputFile], unit_size: int) -> dict:
    """Everything that decides a unit's persisted content; work is reused only under an equal plan.

    --on-bad-record is left out on purpose: a unit persisted under `error` had no rejects, and a
    unit persisted under `skip` records its rejects, so either mode can reuse the other's units.
    """
    spec = opts.tokenizer
    return {
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


class _Assembler:
    """Feeds finished units to the DatasetWriter in unit order and keeps the record accounting."""

    def __init__(
        self, opts: ConvertOptions, files: list[InputFile], units: list[Unit], workdir: WorkDir
    ):
        self.opts = opts
        self.files = files
        self.units = units
        self.workdir = workdir
        self.dtype = opts.tokenizer.dtype
        self.writer = DatasetWriter(
            opts.output,
            vocab_size=opts.tokenizer.vocab_size,
            tokenizer=opts.tokenizer.as_metadata(),
            name=opts.name,
            shard_size=opts.shard_size,
            compression_level=opts.compression_level,
            frame_size=opts.frame_size,
        )
        self.rejects = RejectsFile(Path(opts.output)) if opts.on_bad_record == "skip" else None
        self.records_seen = [0] * len(files)  # lines/rows of each file consumed so far
        self.records_read = 0
        self.documents = 0
        self.rejected: dict[str, int] = {}

    def add(self, result: UnitResult | UnitFailure | EncoderMismatch) -> None:
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
        for piece_no, record, reason, detail in result.rejects:
            if self.rejects is None:
                self._raise(unit, bases, piece_no, record, reason, detail)
            path = self.files[unit.pieces[piece_no].input_index].path
            self.rejects.write(path, bases[piece_no] + record, reason, detail)
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
        tokens, docs = self.workdir.load_unit(result.index, self.dtype)
        if result.frame_settings == [self.opts.frame_size, self.opts.compression_level]:
            frames, stored = result.frames, self.workdir.load_frames(result.index)
        else:  # persisted by a run with other --frame-size/--compression-level: re-encode
            buffer = io.BytesIO()
            framer = FrameBuilder(self.opts.frame_size, self.opts.compression_level, buffer)
            framer.add(tokens, docs[:, 2])
            frames, stored = framer.finish(), buffer.getbuffer()
        paths = [self.files[p.input_index].path for p in unit.pieces]
        records = np.asarray(bases, dtype=np.int64)[docs[:, 0]] + docs[:, 1]
        self.writer.add_frames(
            tokens, docs[:, 2], frames, stored, provenance=(paths, docs[:, 0], records)
        )
        self.records_read += result.records_read
        self.documents += result.num_documents

    def _raise(
        self, unit: Unit, bases: list[int], piece_no: int, record: int, reason: str, detail: str
    ):
        path = self.files[unit.pieces[piece_no].input_index].path
        raise BadRecordError(path, bases[piece_no] + record, f"{reason}: {detail}")

    def finish(self, settings: dict):
        rejected_total = sum(self.rejected.values())
        if self.documents + rejected_total != self.records_read:
            raise AssertionError(
                f"record accounting broken: {self.documents} written + {rejected_total} rejected "
                f"!= {self.records_read} read"
            )
        rejects_path = self.rejects.commit() if self.rejects is not None else None
        if rejects_path is None:
            (Path(self.opts.output) / "rejects.jsonl").unlink(missing_ok=True)
        extra = {
            "convert": settings,
            "records_read": self.records_read,
            "documents_written": self.documents,
            "records_rejected": rejected_total,
            "rejected_by_reason": dict(sorted(self.rejected.items())),
        }
        return self.writer.close(extra=extra), rejects_path

    def abandon(self) -> None:
        if self.rejects is not None:
            self.rejects.discard()


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
            stored_token_bytes=_stored_token_bytes(out, done),
        )  # fmt: skip

    units = plan_units(files, unit_size, opts.txt_mode)
    dtype = opts.tokenizer.dtype
    ready: dict[int, UnitResult | UnitFailure | EncoderMismatch | Exception] = {}
    for unit in units:
        previous = workdir.load_result(unit.index, dtype)
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
        assembler = _Assembler(opts, files, units, workdir)
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
    )  # fmt: skip
