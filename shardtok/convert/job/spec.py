"""A conversion job: its spec (ConvertJob), how one process runs it (RunOptions), and the plan file.

A ConvertJob is the one description of a conversion. The CLI and the Python API build it; the
plan phase writes it into ``OUT/.shardtok-work/plan.json``::

    {"format": "shardtok.convert-plan", "version": 2,
     "fingerprint": {...everything that decides a unit's content...},
     "job": {...ConvertJob.to_json(), with the input files found, the work units, base_dir...}}

and ``OUT/.shardtok-work/tokenizer.json`` the tokenizer's serialized backend, whose sha256 is the
tokenizer fingerprint: a worker needs no tokenizer files, and a tokenizer.json that is not the
one planned is refused. Every engine (the one-command run, a rank of run-units, a dask task)
reads the job back from there (plan_file.py, as someone else's file), so no setting is written
down twice. Work units are reused only under an equal ``fingerprint``; the rest of the job
(shard size, compression, bad-record mode) may change between a run and its rerun.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass

from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.units import Unit, auto_unit_size
from shardtok.convert.sft.config import SFTConfig
from shardtok.convert.sft.setup import SFTSetup
from shardtok.convert.tokenizing.tokenizer import TokenizerSpec
from shardtok.format.dataset_writer import DEFAULT_SHARD_SIZE
from shardtok.format.frames import DEFAULT_FRAME_SIZE
from shardtok.storage.location import is_local

PLAN_FORMAT = "shardtok.convert-plan"
# 2: a piece is [input, start, end, row group, rows] (rows: null, or [first, stop] of a row group
# or record batch cut into row ranges); 1 (shardtok 0.2): [input, start, end, row group].
PLAN_VERSION = 2
TOKENIZER_NAME = "tokenizer.json"
# The fingerprint's own format (the whole plan.json of shardtok 0.2 carried it): bump it when a
# unit's persisted content changes for the same inputs and options.
FINGERPRINT_FORMAT = 1
# The fingerprint's entry covering the unit list and job name. The units follow from the rest of
# the fingerprint, so it only tells an edited or damaged plan.json from the planned one (a unit
# dropped from the list would otherwise be merged away unseen); the name only names the shards,
# so it is left out when deciding whether finished units can be kept. Plans written before it
# (shardtok 0.3.0 and earlier) have no such entry and are read as before.
PLAN_DIGEST = "plan"


@dataclass(frozen=True)
class ConvertJob:
    """One conversion: what to read, how to tokenize it, what to write.

    The CLI and the Python API build it; :func:`plan_document` stores it in plan.json, from
    which every phase on every machine reads it back (plan_file.job_from_json, which checks
    it as someone else's file), so a setting is written down once. How this process runs it (workers, progress, credentials) is
    :class:`RunOptions`, never stored.
    """

    inputs: tuple[str, ...]  # files, folders or glob patterns
    output: str
    tokenizer: TokenizerSpec
    text_key: str = "text"
    txt_mode: str = "file"  # "file": one document per .txt file; "lines": one per line
    on_bad_record: str = "error"  # or "skip"
    shard_size: int = DEFAULT_SHARD_SIZE
    compression_level: int | None = 3  # None = uncompressed .bin members
    frame_size: int = DEFAULT_FRAME_SIZE  # uncompressed token bytes per zstd frame
    unit_size: int | None = None  # None: chosen for the corpus when planned
    name: str = "shard"
    # Fine-tuning records (see shardtok.convert.sft.setup.prepare_sft); None: text documents.
    sft: SFTSetup | None = None

    def to_json(self) -> dict:
        """The job as plan.json's ``job`` holds it, but for the tokenizer's serialized backend,
        which is tokenizer.json beside it (megabytes, and hashed into the fingerprint);
        plan_file.job_from_json reads it back."""
        spec = self.tokenizer
        return {
            "inputs": list(self.inputs),
            "output": self.output,
            "name": self.name,
            "text_key": self.text_key,
            "txt_mode": self.txt_mode,
            "on_bad_record": self.on_bad_record,
            "shard_size": self.shard_size,
            "compression_level": self.compression_level,
            "frame_size": self.frame_size,
            "unit_size": self.unit_size,
            "tokenizer": {
                "name": spec.name,
                "fingerprint": spec.fingerprint,
                "vocab_size": spec.vocab_size,
                "eos_id": spec.eos_id,
                "bos_id": spec.bos_id,
                "append_eos": spec.append_eos,
                "prepend_bos": spec.prepend_bos,
                "backend": spec.backend,
                "backend_note": spec.backend_note,
                # For the summary only (the ids above are what counts).
                "eos_token": spec.eos_token,
                "bos_token": spec.bos_token,
                "eos_source": spec.eos_source,
                "bos_source": spec.bos_source,
                "eos_note": spec.eos_note,
            },
            "sft": None if self.sft is None else _sft_document(self.sft),
        }


@dataclass(frozen=True)
class RunOptions:
    """How this process runs a job. Never stored: a rerun may change any of it, and the
    storage options hold credentials."""

    workers: int = 0  # 0 = the cores this process may run on
    progress: bool | str = True  # True ("auto"), "always" or False ("never"): see progress.py
    start_method: str | None = None  # workers: None = fork on Linux, spawn elsewhere
    overwrite: bool = False
    keep_work: bool = False
    # fsspec options for a remote output folder and remote inputs (credentials, endpoint)
    storage_options: dict | None = None


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker needs besides the unit itself (sent once, at pool start)."""

    job: ConvertJob
    files: tuple[InputFile, ...]  # the job's input files, as this worker reads them
    # fsspec options for remote inputs and a remote output (credentials: never in the plan)
    storage_options: dict | None = None

    @property
    def stop_at_bad_record(self) -> bool:
        return self.job.on_bad_record == "error"


_MAX_DISTRIBUTED_UNIT = 256 << 20
_TARGET_UNITS = 10_000


def distributed_unit_size(total_bytes: int) -> int:
    """The default unit size when units are spread over machines (plan, the dask engine).

    Every unit is a handful of files in the work folder, a line in every listing, and a task
    with its own start-up cost; at the local default (16 MiB) a 10 TB corpus would be 600,000
    of them. So units grow to about total/10,000 (10,000 units up to 2.5 TB), at most 256 MiB
    (a 10 TB corpus: 37,000 units). Below ~160 GB this is the local default exactly, so a small
    distributed run gives the very bytes of the plain command (the unit size decides where
    frames end).
    """
    return max(
        auto_unit_size(total_bytes), min(_MAX_DISTRIBUTED_UNIT, total_bytes // _TARGET_UNITS)
    )


def settings(opts: ConvertJob, files: list[InputFile]) -> dict:
    """The conversion's settings as stored in the manifest (deterministic: no times, no workers)."""
    doc = {
        "unit_size": opts.unit_size,  # frames end at unit ends
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
        doc["sft"] = opts.sft.metadata
    return doc


def _input_identity(f: InputFile) -> list:
    identity = [f.path, f.kind, f.compression, f.size, f.mtime_ns]
    if f.etag is not None:  # remote inputs: the object's ETag stands for the mtime
        identity.append(f.etag)
    return identity


def fingerprint(opts: ConvertJob, files: list[InputFile]) -> dict:
    """Everything that decides a unit's persisted content; work is reused only under an equal one.

    --on-bad-record is left out on purpose: a unit persisted under `error` had no rejects, and a
    unit persisted under `skip` records its rejects, so either mode can reuse the other's units.
    """
    spec = opts.tokenizer
    doc = {
        "format": FINGERPRINT_FORMAT,
        "inputs": [_input_identity(f) for f in files],
        "text_key": opts.text_key,
        "txt_mode": opts.txt_mode,
        "tokenizer": spec.fingerprint,
        "vocab_size": spec.vocab_size,
        "eos_id": spec.eos_id if spec.append_eos else None,
        "bos_id": spec.bos_id if spec.prepend_bos else None,
        "unit_size": opts.unit_size,
    }
    if opts.sft is not None:
        doc["sft"] = opts.sft.metadata
    return doc


def plan_digest(name: str, units: list) -> str:
    """The fingerprint's PLAN_DIGEST entry: sha256 of the job's name and its units as plan.json
    lists them."""
    text = json.dumps([name, units], separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def _reuse_key(fingerprint_: object) -> object:
    if not isinstance(fingerprint_, dict):
        return fingerprint_
    return {k: v for k, v in fingerprint_.items() if k != PLAN_DIGEST}


def tokenizer_fingerprint(backend_json: bytes) -> str:
    """As load_tokenizer computes it: sha256 of the backend tokenizer's serialized JSON."""
    return "sha256:" + hashlib.sha256(backend_json).hexdigest()


# -- writing ---------------------------------------------------------------------------------


def _sft_document(setup: SFTSetup) -> dict:
    config = {}
    for f in dataclasses.fields(SFTConfig):
        value = getattr(setup.config, f.name)
        config[f.name] = list(value) if isinstance(value, tuple) else value
    renderer = setup.renderer
    if setup.config.format == "jq":
        doc = {
            "kind": "construction",
            "bos_token": renderer.bos_token,
            "eos_token": renderer.eos_token,
            "separator": renderer.separator,
        }
    else:
        # The resolved template text, not where it came from: workers need no tokenizer folder
        # and no template file.
        doc = {
            "kind": "chat_template",
            "name": renderer.name,
            "source": renderer.source,
            "variables": dict(renderer.variables),
            "special_tokens": list(renderer.special_tokens),
            "train_on_input": renderer.train_on_input,
            "train_roles": list(renderer.train_roles),
        }
    return {"config": config, "renderer": doc}


def plan_document(job: ConvertJob, files: list[InputFile], units: list[Unit]) -> dict:
    """plan.json's content for `job` (its output resolved, its unit size chosen)."""
    assert job.unit_size is not None
    inputs = []
    for f in files:
        entry = {
            "path": f.path,
            "kind": f.kind,
            "compression": f.compression,
            "size": f.size,
            "mtime_ns": f.mtime_ns,
        }
        if f.etag is not None:
            entry["etag"] = f.etag
        inputs.append(entry)
    units_json = [[u.index, u.nbytes, [p.to_json() for p in u.pieces]] for u in units]
    doc = job.to_json()
    # The files found, with what identifies them, stand for the inputs as given. Relative input
    # paths are kept as given (they name the inputs in the manifest and in messages); a worker
    # elsewhere reads them relative to the folder the plan was made in.
    doc.update(inputs=inputs, units=units_json, base_dir=os.getcwd())
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "fingerprint": {
            **fingerprint(job, files),
            PLAN_DIGEST: plan_digest(job.name, units_json),
        },
        "job": doc,
    }


def units_as_version_1(units: list) -> list | None:
    """A plan's units (as in plan.json) as version 1 wrote them, or None when a piece is a row
    range (which version 1 could not express)."""
    old = []
    for index, nbytes, pieces in units:
        if any(piece[4] is not None for piece in pieces):
            return None
        old.append([index, nbytes, [piece[:4] for piece in pieces]])
    return old


def same_units(existing: object, doc: dict) -> bool:
    """Whether the plan `existing` (plan.json as found, anything) may keep its finished units
    under the plan `doc`: both in this format, with equal fingerprints (but for the PLAN_DIGEST
    entry: a plan with another name keeps its units, and one without the entry too). A version 1 plan (the
    previous release) keeps them too when its units are exactly `doc`'s: a unit's files are the
    same in both versions, only the plan's way of writing pieces changed."""
    if not (
        isinstance(existing, dict)
        and existing.get("format") == PLAN_FORMAT
        and _reuse_key(existing.get("fingerprint")) == _reuse_key(doc["fingerprint"])
    ):
        return False
    if existing.get("version") == PLAN_VERSION:
        return True
    job = existing.get("job")
    return (
        existing.get("version") == 1
        and isinstance(job, dict)
        and job.get("units") == units_as_version_1(doc["job"]["units"])
    )


@dataclass(frozen=True)
class Plan:
    """A planned job as every phase works from it: the job (its ``inputs`` the input files'
    paths, its ``unit_size`` resolved), the files found, the work units and the fingerprint."""

    job: ConvertJob
    base_dir: str  # where the plan was made: relative input paths are relative to it
    files: tuple[InputFile, ...]  # paths as the user gave them (they name inputs in messages)
    units: tuple[Unit, ...]
    fingerprint: dict

    @property
    def unit_size(self) -> int:
        assert self.job.unit_size is not None
        return self.job.unit_size

    def reading_files(self) -> tuple[InputFile, ...]:
        """The input files with relative local paths made absolute against the planning
        folder, for a worker whose working directory may be anywhere."""
        out = []
        for f in self.files:
            if is_local(f.path) and not os.path.isabs(f.path):
                f = dataclasses.replace(f, path=os.path.join(self.base_dir, f.path))
            out.append(f)
        return tuple(out)
