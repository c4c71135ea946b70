"""Tokenizing one work unit and persisting its result, inside a worker process.

With ``--sft`` each record goes record -> Conversation -> Rendered -> (ids, mask) instead, in
batches of about 1 MiB of rendered text (SFTRecords: one tiktoken call per batch, each record's
masks from its own ids), and the unit's masks (one uint8 per token) are persisted next to its
tokens.

Texts are encoded in batches of about 1 MiB of characters (unit_batches.py); tokens stream to a temporary file
so a unit made of one large compressed file never holds all its tokens in memory. The unit's
files are created, written, its frames compressed and its files but the marker published on a
second thread (background.py: one per worker; it concludes a unit, verdict, marker and result,
while the tokenizer starts the next). The tiktoken canary's verdict comes with the unit where
the main process could read its first document (canary.py), else that thread runs it; a worker
still tokenizes on one core. Under
``--on-bad-record error`` a worker stops at the unit's first bad record and persists only that
failure (no tokens); the assembler raises it once every earlier unit is known to be clean, so the
error reported is always the first bad record of the input.

worker.py is the process (its configuration, its encoder or SFT pipeline, its writer thread, the
pool's protocol); this module is what happens to one unit there, so each can be read alone.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok.convert.inputs.records import Reject, TextRun
from shardtok.convert.inputs.table_pieces import BlockCache
from shardtok.convert.inputs.units import Unit
from shardtok.convert.job.failures import EncoderMismatch, UnitFailure
from shardtok.convert.job.spec import WorkerConfig
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.workdir import ChecksumWriter, WorkDir, unit_base
from shardtok.convert.sft.conversation import SFTBad
from shardtok.convert.tokenizing.canary import Checked, canary_chars
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.worker.background import BackgroundWriter
from shardtok.convert.worker.unit_batches import (
    DocRows,
    SFTBatcher,
    SFTRecords,
    TextBatcher,
    frame_encoder,
)
from shardtok.convert.worker.unit_reader import PieceReader, ReadAhead
from shardtok.format.frames import FrameBuilder
from shardtok.storage.folder import temporary_name


class Scratch:
    """Names for a unit's files before they are published (`scratch(name)` -> a path).

    Locally they are temporaries in the work folder itself, so publishing is a rename; a
    scratch folder per unit cost a mkdir and an rmtree each, ~4% of a worker's time with
    256 KiB units. A remote work folder gets a local temporary folder (published by PUTs).
    What is left at :meth:`close` (a failed unit's files) is removed; a killed worker's
    temporaries are swept by the next run, like any other."""

    def __init__(self, workdir: WorkDir, index: int):
        self.workdir = workdir
        self.index = index
        self.made: list[Path] = []
        self.folder = None
        if not workdir.is_local:
            self.folder = contextlib.ExitStack()
            self.local = self.folder.enter_context(workdir.folder.scratch())

    def __call__(self, name: str) -> Path:
        if self.folder is not None:
            return self.local / name
        self.made.append(self.workdir.path / temporary_name(f"{unit_base(self.index)}.{name}"))
        return self.made[-1]

    def published(self) -> None:
        self.made.clear()  # all were moved into place: nothing to remove (5 syscalls)

    def close(self) -> None:
        if self.folder is not None:
            self.folder.close()
        for left in self.made:
            left.unlink(missing_ok=True)
        self.made.clear()


@dataclass(frozen=True)
class Worker:
    """What a worker process holds for its job, built once (process.init_worker) and handed to
    every unit it tokenizes."""

    config: WorkerConfig
    workdir: WorkDir
    encoder: BatchEncoder | None  # text documents: the batch encoder
    sft: SFTRecords | None  # fine-tuning records: their pipeline
    # Row groups or record batches cut into row ranges, decoded once (see table_pieces.py).
    blocks: BlockCache


def tokenize(
    unit: Unit,
    worker: Worker,
    scratch: Scratch,
    sink: BackgroundWriter,
    checked: Checked | None = None,
    ahead: ReadAhead | None = None,
    read_next: Callable[[], None] | None = None,
) -> Callable[[BaseException | None], UnitResult | UnitFailure | EncoderMismatch]:
    """Read and tokenize `unit`, handing its writes to the sink; returns the unit's
    conclusion, to be run on the sink's thread after them with the first failure among them
    (see process.start_unit); `sink` is the process's writer thread. `checked`: the canary's
    verdict from the main process (canary.py), taken if it is on the text this unit's canary
    checks, else the canary runs here. `ahead`: this unit's records if they were read ahead
    (unit_reader.py); `read_next` is called once the unit is read, before its last batch is
    encoded, to start reading the next one."""
    config, workdir, encoder, sft, blocks = (
        worker.config, worker.workdir, worker.encoder, worker.sft, worker.blocks
    )  # fmt: skip
    suffixes = [".tokens", ".frames"] + ([".mask"] if sft else []) + [".docs.npy", ".json"]
    paths = {suffix: scratch(suffix[1:]) for suffix in suffixes}
    # Created, written and (frames) compressed on the sink's thread; read there at the end.
    writers = {suffix: ChecksumWriter(None) for suffix in suffixes}
    out, frames_out, mask_out = writers[".tokens"], writers[".frames"], writers.get(".mask")
    # Frames end at the unit's end, so the worker can compress them: the shard assembly
    # then only appends them to shards (see FrameBuilder).
    framer = FrameBuilder(
        config.job.frame_size, config.job.compression_level, frames_out,
        frame_encoder(config.job.compression_level),
    )  # fmt: skip
    doc_rows = DocRows()
    piece_records: list[int] = []
    rejects: list[list] = []
    records_read = 0
    # (piece, record, text) of the unit's first document, for the canary, when the main
    # process sent no verdict for it (canary.py). It runs on the sink's thread as soon as that
    # document is read (tokenizers' encode holds the GIL, so it costs the tokenizing thread
    # its ~0.35 ms per unit either way), and its verdict is awaited wherever the unit can
    # end (a bad record in error mode, an exception, its last record), so the outcome is what
    # checking the first document first would give; the unit's marker, the only thing that
    # makes its files count, is written after it.
    canary = None
    # What runs the canary: the batch encoder, or with --sft the SFT encoder, which compares
    # tiktoken's ids of the unit's first rendered record with tokenizers' (SFTEncoder.canary).
    checker = encoder if sft is None else sft.encoder
    verdict: list = []  # the canary's: None or where the encoders differ
    finished: list[np.ndarray] = []  # the frame table, from the sink

    def close_files(published: bool) -> None:
        for suffix, writer in writers.items():
            if writer.file is not None and not (published and suffix == ".json"):
                writer.file.close()

    def ended(make):
        """The conclusion: `make(error, mismatch)` gives the outcome or raises; the files
        are closed whatever happens."""

        def conclusion(error: BaseException | None):
            try:
                return make(error, _canary_mismatch(checker, unit, canary, verdict))
            finally:
                close_files(False)

        return conclusion

    def first_document(piece_no: int, record: int, text: str):
        canary = (piece_no, record, text[: canary_chars(unit)])
        if checked is not None and checked.applies(*canary):
            verdict.append(checked.mismatch)
        else:
            sink.submit(functools.partial(_run_canary, checker, canary[2], verdict))
        return canary

    stop = config.stop_at_bad_record

    def finished_records(done: list[tuple]) -> UnitFailure | None:
        """SFT records finished by a batch (SFTRecords.add), in order, to the unit's files and
        rejects; the first bad one under --on-bad-record error is the unit's failure."""
        nonlocal canary
        for piece_no, record, item, text in done:
            if isinstance(item, (Reject, SFTBad)):
                if stop:
                    return UnitFailure(unit.index, piece_no, record, item.reason, item.detail)
                rejects.append([piece_no, record, item.reason, item.detail])
                continue
            if canary is None:
                canary = first_document(piece_no, record, text)
            doc_rows.add(piece_no, record)
            batcher.add(item.ids, item.mask)
        return None

    batcher = None
    try:
        # Creating a file costs ~0.15 ms of CPU here (ext4): done beside the tokenizer.
        sink.submit(functools.partial(_open_into, writers, paths))
        if sft is None:
            batcher = TextBatcher(encoder, out, framer, sink)
        else:
            sft.start_unit()
            batcher = SFTBatcher(config.job.tokenizer.dtype, out, mask_out, framer, sink)
        fields = sft.fields if sft is not None else None
        read = ahead.take() if ahead is not None else None
        for piece_no, piece in enumerate(unit.pieces):
            reader = (
                read[piece_no]
                if read is not None
                else PieceReader(config, piece, sft is not None, fields, blocks)
            )
            for entry in reader:
                if type(entry) is TextRun:
                    records_read += len(entry.numbers)
                    if canary is None:
                        canary = first_document(piece_no, entry.numbers[0], entry.texts[0])
                    doc_rows.add_run(piece_no, entry.numbers)
                    batcher.extend(entry.texts)
                    continue
                record, item = entry
                records_read += 1
                if sft is not None:
                    failure = finished_records(sft.add(piece_no, record, item, stop))
                    if failure is not None:
                        return ended(functools.partial(_failed, failure))
                    continue
                if isinstance(item, Reject):
                    if config.stop_at_bad_record:
                        failure = UnitFailure(
                            unit.index, piece_no, record, item.reason, item.detail
                        )
                        return ended(functools.partial(_failed, failure))
                    rejects.append([piece_no, record, item.reason, item.detail])
                else:
                    if canary is None:
                        canary = first_document(piece_no, record, item)
                    doc_rows.add(piece_no, record)
                    batcher.add(item)
            piece_records.append(reader.records)
        if sft is not None:
            failure = finished_records(sft.flush(stop))
            if failure is not None:
                return ended(functools.partial(_failed, failure))
        if read_next is not None:
            read_next()  # the next unit's reading, on the sink's thread while this one encodes
        batcher.flush()
        sink.submit(lambda: finished.append(framer.finish()))
        sizes = np.concatenate(batcher.sizes) if batcher.sizes else np.empty(0, np.int32)
        docs = np.empty((doc_rows.count, 3), dtype=np.int64)
        doc_rows.fill(docs)
        docs[:, 2] = sizes
        # Every file but the marker goes into place beside the canary; without a marker
        # they are what a killed worker leaves, and a redo replaces them.
        sink.submit(functools.partial(_publish, workdir, unit.index, writers, paths, docs))
    except Exception as exc:
        return ended(functools.partial(_raised, exc))
    except BaseException:
        with contextlib.suppress(BaseException):
            sink.drain()
        close_files(False)
        raise
    # Known now, on this thread: the next unit resets the SFT counts.
    sft_stats = None if sft is None else sft.unit_stats(batcher.trained)
    num_tokens = batcher.num_tokens

    def done(error: BaseException | None):
        mismatch = _canary_mismatch(checker, unit, canary, verdict)
        if error is not None or mismatch is not None:
            close_files(False)
            if error is not None:
                raise error
            return mismatch
        close_files(True)
        result = UnitResult(
            index=unit.index,
            num_documents=doc_rows.count,
            num_tokens=num_tokens,
            input_bytes=unit.nbytes,
            piece_records=piece_records,
            records_read=records_read,
            rejects=rejects,
            frames=finished[0].tolist(),
            frame_settings=[config.job.frame_size, config.job.compression_level],
            sft=sft_stats,
            checksums={suffix: writers[suffix].crc for suffix in suffixes[:-1]},
        )
        with writers[".json"].file as marker:  # created by the sink: only written here
            marker.write(result.to_json())
        workdir.publish_marker(unit.index, paths[".json"])
        scratch.published()
        return result

    return done


def _failed(failure: UnitFailure, error: BaseException | None, mismatch):
    """A bad record under --on-bad-record error: a failed write before it wins, then a
    canary mismatch (an earlier finding than the record)."""
    if error is not None:
        raise error
    return mismatch or failure


def _raised(exc: Exception, error: BaseException | None, mismatch):
    """An exception while tokenizing: a canary mismatch explains it best when there is one
    (then a failed write, else the mismatch); otherwise it stands."""
    if mismatch is None:
        raise exc
    if error is not None:
        raise error from None
    return mismatch


def _open_into(writers: dict, paths: dict) -> None:
    # As Folder.scratch did: a caller may hand units to a work folder not made yet.
    next(iter(paths.values())).parent.mkdir(parents=True, exist_ok=True)
    for suffix, path in paths.items():
        writers[suffix].file = open(path, "wb")  # noqa: SIM115 (tokenize closes it)


def _publish(workdir: WorkDir, index: int, writers: dict, paths: dict, docs: np.ndarray) -> None:
    np.save(writers[".docs.npy"], docs)
    files = {}
    for suffix, path in paths.items():
        if suffix != ".json":
            writers[suffix].file.close()
            files[suffix] = path
    workdir.publish_files(index, files)


def _run_canary(encoder: BatchEncoder, text: str, verdict: list) -> None:
    verdict.append(encoder.canary(text))


def _canary_mismatch(
    encoder: BatchEncoder | None, unit: Unit, canary, verdict: list
) -> EncoderMismatch | None:
    """EncoderMismatch if tiktoken and tokenizers encode the unit's first document differently
    (`verdict`: the sink's, once it is idle; checked here when a job before it failed)."""
    if canary is None:
        return None
    piece_no, record, text = canary
    mismatch = verdict[0] if verdict else encoder.canary(text)
    return None if mismatch is None else EncoderMismatch(unit.index, piece_no, record, mismatch)
