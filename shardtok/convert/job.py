"""The plan file: one conversion job as JSON, so any process on any machine can take a part of it.

``OUT/.shardtok-work/plan.json`` holds::

    {"format": "shardtok.convert-plan", "version": 1,
     "fingerprint": {...everything that decides a unit's content...},
     "job": {...the options, the input files, the work units, the tokenizer, the SFT setup...}}

and ``OUT/.shardtok-work/tokenizer.json`` the tokenizer's serialized backend, whose sha256 is the
tokenizer fingerprint: a worker needs no tokenizer files, and a tokenizer.json that is not the
one planned is refused. Work units are reused only under an equal ``fingerprint``; the rest of
the job (shard size, compression, bad-record mode) may change between a run and its rerun.

A plan is read as someone else's file: JSON only, every field checked for type and range, the
fingerprint recomputed from the job and compared, the chat template checked against the hash the
fingerprint records. Chat templates run in a sandboxed Jinja environment
(:mod:`shardtok.convert.sft.jinja_env`), so a template from a plan is data, not code. A plan
written by a newer shardtok is refused, naming both versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass

from shardtok.convert.inputs import InputFile
from shardtok.convert.sft.config import FORMATS, ROLES, TRUNCATIONS, SFTConfig
from shardtok.convert.sft.setup import SFTSetup
from shardtok.convert.tokenizer import BACKENDS, TokenizerSpec
from shardtok.convert.units import InputRange, Unit, auto_unit_size
from shardtok.errors import ShardtokError
from shardtok.storage.location import is_local

PLAN_FORMAT = "shardtok.convert-plan"
PLAN_VERSION = 1
PLAN_NAME = "plan.json"
TOKENIZER_NAME = "tokenizer.json"
# The fingerprint's own format (the whole plan.json of shardtok 0.2 carried it): bump it when a
# unit's persisted content changes for the same inputs and options.
FINGERPRINT_FORMAT = 1

_KINDS = ("jsonl", "txt", "parquet")
_COMPRESSIONS = (None, "gzip", "zstd")
_TXT_MODES = ("file", "lines")
_BAD_RECORD_MODES = ("error", "skip")
_MAX_DISTRIBUTED_UNIT = 256 << 20
_TARGET_UNITS = 10_000
_AGAIN = "run `shardtok convert plan` again"


class PlanError(ShardtokError):
    """plan.json or tokenizer.json is missing, damaged, edited, or from another shardtok."""


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


def settings(opts, files: list[InputFile], unit_size: int) -> dict:
    """The conversion's settings as stored in the manifest (deterministic: no times, no workers)."""
    doc = {
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
        doc["sft"] = opts.sft.metadata
    return doc


def _input_identity(f: InputFile) -> list:
    identity = [f.path, f.kind, f.compression, f.size, f.mtime_ns]
    if f.etag is not None:  # remote inputs: the object's ETag stands for the mtime
        identity.append(f.etag)
    return identity


def fingerprint(opts, files: list[InputFile], unit_size: int) -> dict:
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
        "unit_size": unit_size,
    }
    if opts.sft is not None:
        doc["sft"] = opts.sft.metadata
    return doc


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


def plan_document(opts, files: list[InputFile], units: list[Unit], unit_size: int) -> dict:
    """plan.json's content for `opts` (a ConvertOptions whose output is resolved)."""
    spec = opts.tokenizer
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
    job = {
        "output": opts.output,
        # Relative input paths are kept as given (they name the inputs in the manifest and in
        # messages); a worker elsewhere reads them relative to the folder the plan was made in.
        "base_dir": os.getcwd(),
        "name": opts.name,
        "text_key": opts.text_key,
        "txt_mode": opts.txt_mode,
        "on_bad_record": opts.on_bad_record,
        "shard_size": opts.shard_size,
        "compression_level": opts.compression_level,
        "frame_size": opts.frame_size,
        "unit_size": unit_size,
        "inputs": inputs,
        "units": [[u.index, u.nbytes, [p.to_json() for p in u.pieces]] for u in units],
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
        },
        "sft": None if opts.sft is None else _sft_document(opts.sft),
    }
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "fingerprint": fingerprint(opts, files, unit_size),
        "job": job,
    }


def same_units(existing: object, doc: dict) -> bool:
    """Whether the plan `existing` (plan.json as found, anything) may keep its finished units
    under the plan `doc`: both in this format, with equal fingerprints."""
    return (
        isinstance(existing, dict)
        and existing.get("format") == PLAN_FORMAT
        and existing.get("version") == PLAN_VERSION
        and existing.get("fingerprint") == doc["fingerprint"]
    )


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A plan as read back: what a worker needs to tokenize a unit, and the merge to finish."""

    output: str  # as recorded when planned
    base_dir: str
    name: str
    text_key: str
    txt_mode: str
    on_bad_record: str
    shard_size: int
    compression_level: int | None
    frame_size: int
    unit_size: int
    files: tuple[InputFile, ...]  # paths as the user gave them (they name inputs in messages)
    units: tuple[Unit, ...]
    tokenizer: TokenizerSpec
    sft: SFTSetup | None
    fingerprint: dict

    def reading_files(self) -> tuple[InputFile, ...]:
        """The input files with relative local paths made absolute against the planning
        folder, for a worker whose working directory may be anywhere."""
        out = []
        for f in self.files:
            if is_local(f.path) and not os.path.isabs(f.path):
                f = dataclasses.replace(f, path=os.path.join(self.base_dir, f.path))
            out.append(f)
        return tuple(out)


class _Check:
    """Type and range checks naming the field, raising PlanError in one line."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, message: str):
        raise PlanError(
            f"{self.where}: {key} {message} (the plan is damaged or was edited: {_AGAIN})"
        )

    def get(self, doc, key, path=None):
        """doc[key] for a mapping or a list, or a failure saying it is missing."""
        if isinstance(doc, dict) and key in doc:
            return doc[key]
        if isinstance(doc, list) and isinstance(key, int) and 0 <= key < len(doc):
            return doc[key]
        self.fail(path or str(key), "is missing")

    def of(self, doc, key, kinds, label: str, path: str | None = None):
        name = path or str(key)
        value = self.get(doc, key, name)
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.fail(name, f"must be {label}, got {_short(value)}")
        return value

    def integer(self, doc, key, low=0, high=None, path=None, optional=False) -> int | None:
        name = path or str(key)
        if optional and self.get(doc, key, name) is None:
            return None
        value = self.of(doc, key, int, "an integer", name)
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            self.fail(name, f"must be {bound}, got {value}")
        return value

    def string(self, doc, key, path=None, optional=False) -> str | None:
        if optional and self.get(doc, key, path) is None:
            return None
        return self.of(doc, key, str, "a string", path)

    def boolean(self, doc, key, path=None) -> bool:
        return self.of(doc, key, bool, "true or false", path)

    def choice(self, doc, key, choices, path=None):
        name = path or str(key)
        value = self.get(doc, key, name)
        if isinstance(value, bool) or value not in choices:
            shown = ", ".join("null" if c is None else str(c) for c in choices)
            self.fail(name, f"must be one of {shown}, got {_short(value)}")
        return value

    def strings(self, doc, key, path=None) -> tuple[str, ...]:
        name = path or str(key)
        value = self.of(doc, key, list, "a list of strings", name)
        if not all(isinstance(v, str) for v in value):
            self.fail(name, "must be a list of strings")
        return tuple(value)

    def string_map(self, doc, key, path=None, nullable=False) -> dict:
        name = path or str(key)
        value = self.of(doc, key, dict, "a mapping of strings", name)
        for k, v in value.items():
            if not isinstance(k, str) or not (isinstance(v, str) or (nullable and v is None)):
                self.fail(name, f"must map strings to strings, got {_short({k: v})}")
        return dict(value)


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False) if _jsonable(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _read_inputs(check: _Check, job: dict) -> tuple[InputFile, ...]:
    entries = check.of(job, "inputs", list, "a list", "job.inputs")
    if not entries:
        check.fail("job.inputs", "is empty")
    files = []
    for i, entry in enumerate(entries):
        at = f"job.inputs[{i}]"
        fields = {
            "path": check.string(entry, "path", f"{at}.path"),
            "kind": check.choice(entry, "kind", _KINDS, f"{at}.kind"),
            "compression": check.choice(entry, "compression", _COMPRESSIONS, f"{at}.compression"),
            "size": check.integer(entry, "size", 0, path=f"{at}.size"),
            "mtime_ns": check.integer(entry, "mtime_ns", 0, path=f"{at}.mtime_ns"),
        }
        if not fields["path"]:
            check.fail(f"{at}.path", "is empty")
        if "etag" in entry:
            etag = check.string(entry, "etag", f"{at}.etag", optional=True)
            if etag is not None:
                fields["etag"] = etag
        files.append(InputFile(**fields))
    return tuple(files)


def _read_units(check: _Check, job: dict, files: tuple[InputFile, ...]) -> tuple[Unit, ...]:
    rows = check.of(job, "units", list, "a list", "job.units")
    units = []
    for i, row in enumerate(rows):
        at = f"job.units[{i}]"
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[2], list)):
            check.fail(at, "must be [index, bytes, [pieces]]")
        check.integer(row, 0, i, i, f"{at} index")
        nbytes = check.integer(row, 1, 0, path=f"{at} bytes")
        if not row[2]:
            check.fail(at, "has no pieces")
        pieces = []
        for j, piece in enumerate(row[2]):
            where = f"{at} piece {j}"
            if not (isinstance(piece, list) and len(piece) == 4):
                check.fail(where, "must be [input, start, end, row group]")
            index = check.integer(piece, 0, 0, len(files) - 1, f"{where} input")
            size = files[index].size
            start = check.integer(piece, 1, 0, size, f"{where} start")
            end = check.integer(piece, 2, start, size, f"{where} end")
            group = check.integer(piece, 3, 0, path=f"{where} row group", optional=True)
            if (group is not None) != (files[index].kind == "parquet"):
                check.fail(where, "has a row group for a file that is not Parquet, or none for one")
            pieces.append(InputRange(index, start, end, group))
        units.append(Unit(i, tuple(pieces), nbytes))
    if not units:
        check.fail("job.units", "is empty")
    return tuple(units)


def _read_tokenizer(check: _Check, job: dict, backend_json: bytes) -> TokenizerSpec:
    doc = check.of(job, "tokenizer", dict, "a mapping", "job.tokenizer")
    at = "job.tokenizer."
    vocab = check.integer(doc, "vocab_size", 1, path=at + "vocab_size")
    eos = check.integer(doc, "eos_id", 0, vocab - 1, at + "eos_id", optional=True)
    bos = check.integer(doc, "bos_id", 0, vocab - 1, at + "bos_id", optional=True)
    append_eos = check.boolean(doc, "append_eos", at + "append_eos")
    prepend_bos = check.boolean(doc, "prepend_bos", at + "prepend_bos")
    if (append_eos and eos is None) or (prepend_bos and bos is None):
        check.fail(at[:-1], "appends an EOS or prepends a BOS it has no id for")
    fingerprint_ = check.string(doc, "fingerprint", at + "fingerprint")
    if tokenizer_fingerprint(backend_json) != fingerprint_:
        raise PlanError(
            f"{check.where}: {TOKENIZER_NAME} next to it is not the tokenizer the plan was made "
            f"with (its sha256 differs from {fingerprint_}): {_AGAIN}"
        )
    try:
        text = backend_json.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{check.where}: {TOKENIZER_NAME} is not UTF-8: {_AGAIN}") from None
    return TokenizerSpec(
        name=check.string(doc, "name", at + "name"),
        backend_json=text,
        fingerprint=fingerprint_,
        vocab_size=vocab,
        eos_id=eos,
        bos_id=bos,
        append_eos=append_eos,
        prepend_bos=prepend_bos,
        backend=check.choice(
            doc, "backend", tuple(b for b in BACKENDS if b != "auto"), at + "backend"
        ),
        backend_note=check.string(doc, "backend_note", at + "backend_note"),
    )


def _read_sft_config(check: _Check, doc: dict) -> SFTConfig:
    at = "job.sft.config."
    max_tokens = check.integer(doc, "max_tokens", 1, path=at + "max_tokens", optional=True)
    roles = check.strings(doc, "train_roles", at + "train_roles")
    if not roles or any(r not in ROLES for r in roles):
        check.fail(at + "train_roles", f"must list some of {', '.join(ROLES)}")
    return SFTConfig(
        format=check.choice(doc, "format", FORMATS, at + "format"),
        column_map=check.string_map(doc, "column_map", at + "column_map"),
        role_map=check.string_map(doc, "role_map", at + "role_map"),
        template=check.string(doc, "template", at + "template", optional=True),
        train_on_input=check.boolean(doc, "train_on_input", at + "train_on_input"),
        train_roles=roles,
        max_tokens=max_tokens,
        truncation=check.choice(doc, "truncation", TRUNCATIONS, at + "truncation"),
        split_special_tokens=check.boolean(
            doc, "split_special_tokens", at + "split_special_tokens"
        ),
        special_tokens=check.string_map(doc, "special_tokens", at + "special_tokens", True),
        loss_masking_jq_patterns=check.strings(
            doc, "loss_masking_jq_patterns", at + "loss_masking_jq_patterns"
        ),
        message_construction=check.strings(
            doc, "message_construction", at + "message_construction"
        ),
        separator=check.string(doc, "separator", at + "separator"),
        source=check.string(doc, "source", at + "source"),
    )


def _read_sft(check: _Check, job: dict) -> SFTSetup | None:
    if check.get(job, "sft", "job.sft") is None:
        return None
    doc = check.of(job, "sft", dict, "a mapping", "job.sft")
    config = _read_sft_config(check, check.of(doc, "config", dict, "a mapping", "job.sft.config"))
    r = check.of(doc, "renderer", dict, "a mapping", "job.sft.renderer")
    at = "job.sft.renderer."
    if config.format == "jq":
        from shardtok.convert.sft.construction import ConstructionRenderer

        check.choice(r, "kind", ("construction",), at + "kind")
        renderer = ConstructionRenderer(
            check.string(r, "bos_token", at + "bos_token"),
            check.string(r, "eos_token", at + "eos_token"),
            check.string(r, "separator", at + "separator"),
        )
        return SFTSetup(config, renderer, config.as_metadata())
    from shardtok.convert.sft.render import ChatTemplateRenderer

    check.choice(r, "kind", ("chat_template",), at + "kind")
    roles = check.strings(r, "train_roles", at + "train_roles")
    renderer = ChatTemplateRenderer(
        check.string(r, "name", at + "name"),
        check.string(r, "source", at + "source"),
        variables=check.string_map(r, "variables", at + "variables"),
        special_tokens=check.strings(r, "special_tokens", at + "special_tokens"),
        train_on_input=check.boolean(r, "train_on_input", at + "train_on_input"),
        train_roles=roles,
    )
    return SFTSetup(config, renderer, config.as_metadata(renderer.name, renderer.source))


def parse_plan(data: bytes, backend_json: bytes | None, where: str) -> Job:
    """The Job in plan.json's bytes `data`, with `backend_json` the bytes of tokenizer.json next
    to it (None: missing); `where` names plan.json in messages. PlanError for anything amiss."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PlanError(f"{where}: not valid JSON ({exc}): {_AGAIN}") from None
    check = _Check(where)
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        if isinstance(doc, dict) and doc.get("format") == FINGERPRINT_FORMAT:
            raise PlanError(
                f"{where}: the work folder of a `shardtok convert` from an older shardtok, which "
                f"the phases cannot read: {_AGAIN}"
            )
        raise PlanError(f"{where}: not a shardtok convert plan (no format {PLAN_FORMAT!r})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        check.fail("version", f"must be a positive integer, got {_short(version)}")
    if version > PLAN_VERSION:
        raise PlanError(
            f"{where}: plan version {version} was written by a newer shardtok; this one reads "
            f"version {PLAN_VERSION}: upgrade shardtok here, or plan with this version"
        )
    job = check.of(doc, "job", dict, "a mapping", "job")
    stored_fingerprint = check.of(doc, "fingerprint", dict, "a mapping", "fingerprint")
    if backend_json is None:
        raise PlanError(f"{where}: {TOKENIZER_NAME} is missing next to it: {_AGAIN}")
    files = _read_inputs(check, job)
    level = check.integer(job, "compression_level", 1, 22, "job.compression_level", optional=True)
    result = Job(
        output=check.string(job, "output", "job.output"),
        base_dir=check.string(job, "base_dir", "job.base_dir"),
        name=check.string(job, "name", "job.name"),
        text_key=check.string(job, "text_key", "job.text_key"),
        txt_mode=check.choice(job, "txt_mode", _TXT_MODES, "job.txt_mode"),
        on_bad_record=check.choice(job, "on_bad_record", _BAD_RECORD_MODES, "job.on_bad_record"),
        shard_size=check.integer(job, "shard_size", 1, path="job.shard_size"),
        compression_level=level,
        frame_size=check.integer(job, "frame_size", 1, path="job.frame_size"),
        unit_size=check.integer(job, "unit_size", 1, path="job.unit_size"),
        files=files,
        units=_read_units(check, job, files),
        tokenizer=_read_tokenizer(check, job, backend_json),
        sft=_read_sft(check, job),
        fingerprint=stored_fingerprint,
    )
    if not result.name or "/" in result.name or "\\" in result.name:
        check.fail("job.name", f"must be a plain file name prefix, got {_short(result.name)}")
    # The job must be the one fingerprinted: this also checks the chat template's text against
    # the hash the fingerprint records.
    if fingerprint(result, list(files), result.unit_size) != stored_fingerprint:
        raise PlanError(
            f"{where}: the job disagrees with the plan's fingerprint (the plan is damaged or was "
            f"edited: {_AGAIN})"
        )
    return result
