"""The plan phase's work, shared by every engine: the checks before any work, the output folder
held for the job, the units planned and written into plan.json, or the finished dataset found.

:func:`open_job` and :func:`plan_job` are what `shardtok convert`, `shardtok convert plan` and
`--engine dask` all start with; what follows differs only in who tokenizes the units.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shardtok.convert.inputs.files import InputFile, discover
from shardtok.convert.inputs.units import Unit, auto_unit_size, plan_units
from shardtok.convert.job.output_dir import (
    REJECTS_NAME,
    OutputDirError,
    make_output_folder,
    output_folder,
    prepare_output,
    refuse_file_output,
    resolve_output,
)
from shardtok.convert.job.output_lock import OutputLock, os_error
from shardtok.convert.job.progress import ConvertResult
from shardtok.convert.job.spec import (
    TOKENIZER_NAME,
    ConvertJob,
    RunOptions,
    plan_document,
    same_units,
    settings,
)
from shardtok.convert.job.workdir import WorkDir
from shardtok.convert.tokenizing.tokenizer import TokenizerSpec
from shardtok.errors import UsageError
from shardtok.format.manifest import Manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage.folder import Folder
from shardtok.storage.location import Location, is_local
from shardtok.storage.source import exists, open_source


@dataclass
class Planned:
    """A planned job: what every phase works from. `done` is the finished dataset of this very
    job, when the output already holds it (then `units` is empty and nothing was written)."""

    job: ConvertJob  # output resolved, unit size chosen
    files: list[InputFile]
    units: list[Unit]
    workdir: WorkDir
    done: Manifest | None = None


def check_sft(job: ConvertJob, files: list[InputFile]) -> None:
    """SFT records are JSON objects, and the template alone decides BOS/EOS."""
    if job.sft is None:
        return
    if job.tokenizer.append_eos or job.tokenizer.prepend_bos:
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
    job: ConvertJob, run: RunOptions, *, remote: bool = False
) -> Iterator[tuple[ConvertJob, list[InputFile]]]:
    """The checks before any work, then the output folder held for this job: yields the job
    with the output resolved, and the input files. A local output is locked (a second
    conversion into it is refused) and an OS error is one line naming the path. `remote`: the
    output may be an object store (the phases), where nothing can lock it."""
    if remote and not is_local(job.output):
        folder = output_folder(job.output, run.storage_options)
        try:
            files = discover(list(job.inputs), job.output, run.storage_options)
            check_sft(job, files)
            yield job, files
        except OSError as exc:
            raise os_error(exc, folder.display) from exc
        return
    job = dataclasses.replace(job, output=resolve_output(job.output))
    out = Path(job.output)
    try:
        refuse_file_output(out)
        files = discover(list(job.inputs), job.output, run.storage_options)
        check_sft(job, files)
        make_output_folder(out)
        with OutputLock(out):
            yield job, files
    except OSError as exc:
        raise os_error(exc, out) from exc


def plan_job(
    job: ConvertJob,
    files: list[InputFile],
    run: RunOptions,
    default_unit_size: Callable[[int], int] = auto_unit_size,
    *,
    tokenizer_file: bool = True,
) -> Planned:
    """Cut the inputs into units and get the output folder ready: a fresh work folder with
    plan.json and tokenizer.json, or the one of an earlier run of the same units (kept, with
    its finished units, and its plan updated to this job), or the finished dataset.
    Call it inside :func:`open_job`. `tokenizer_file=False` leaves tokenizer.json to the
    caller (:func:`write_tokenizer_file`), who must write it before the work is done."""
    folder = Folder(job.output, run.storage_options)
    if job.unit_size is None:
        job = dataclasses.replace(job, unit_size=default_unit_size(sum(f.size for f in files)))
    assert job.unit_size is not None
    units = plan_units(files, job.unit_size, job.txt_mode, run.storage_options)
    doc = plan_document(job, files, units)
    workdir = WorkDir(folder)
    existing = workdir.read_plan() if not run.overwrite else None
    if same_units(existing, doc) and existing != doc:
        # Same units, other merge options (shard size, bad-record mode...): the finished units
        # stay, the plan takes the new options.
        workdir.write_plan(doc)
    workdir, done = prepare_output(folder, job.name, doc, settings(job, files), run.overwrite)
    if done is not None:
        if done.tokenizer != job.tokenizer.as_metadata():
            # The settings compared above leave the tokenizer out: without this, a dataset of
            # another tokenizer or EOS/BOS would pass for this job's, and the summary would name
            # ids that are not in it.
            raise OutputDirError(
                f"{folder.display} already holds a dataset converted with another tokenizer or "
                f"EOS/BOS ({_tokenizer_text(done.tokenizer)}; this run: "
                f"{_tokenizer_text(job.tokenizer.as_metadata())}); pass --overwrite to replace "
                "it, or choose another --output"
            )
        return Planned(job, files, [], workdir, done)
    if tokenizer_file:
        write_tokenizer_file(workdir, job.tokenizer)
    return Planned(job, files, units, workdir)


def write_tokenizer_file(workdir: WorkDir, spec: TokenizerSpec) -> None:
    """tokenizer.json in the work folder, where the phases read the job's tokenizer from,
    unless it is there already. After plan.json (which starts a fresh work folder): a plan
    whose tokenizer.json is missing is refused by the phases, and planning again writes it."""
    backend = spec.backend_json.encode("utf-8")
    if _read_or_none(workdir, TOKENIZER_NAME) != backend:
        workdir.write_file(TOKENIZER_NAME, backend)


def _tokenizer_text(meta: dict) -> str:
    return f"{meta.get('name')}, eos_id {meta.get('eos_id')}, bos_id {meta.get('bos_id')}"


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
