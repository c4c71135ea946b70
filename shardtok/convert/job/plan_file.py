"""Reading a plan back: ``plan.json`` and ``tokenizer.json`` (see job.py) as a checked :class:`Plan`.

A plan is read as someone else's file: JSON only, every field checked for type and range, the
fingerprint recomputed from the job and compared, the chat template checked against the hash the
fingerprint records. Chat templates run in a sandboxed Jinja environment
(:mod:`shardtok.convert.sft.jinja_env`), so a template from a plan is data, not code. A plan
written by a newer shardtok is refused, naming both versions; one of version 1 (shardtok 0.2,
whose pieces have no row ranges) is read as it was written. Anything amiss is a one-line
PlanError naming plan.json and the field.
"""

from __future__ import annotations

import json

from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.units import InputRange, Unit
from shardtok.convert.job.plan_checks import coverage_problem, name_problem, short
from shardtok.convert.job.spec import (
    FINGERPRINT_FORMAT,
    PLAN_DIGEST,
    PLAN_FORMAT,
    PLAN_VERSION,
    TOKENIZER_NAME,
    ConvertJob,
    Plan,
    fingerprint,
    plan_digest,
    tokenizer_fingerprint,
)
from shardtok.convert.job.workdir import PLAN_NAME, WorkDir
from shardtok.convert.sft.config import FORMATS, ROLES, TRUNCATIONS, SFTConfig
from shardtok.convert.sft.setup import SFTSetup
from shardtok.convert.tokenizing.tokenizer import BACKENDS, TokenizerSpec
from shardtok.errors import ShardtokError, UsageError

_KINDS = ("jsonl", "txt", "parquet", "arrow")
_COMPRESSIONS = (None, "gzip", "zstd")
_TXT_MODES = ("file", "lines")
_BAD_RECORD_MODES = ("error", "skip")
_AGAIN = "run `shardtok convert plan` again"
# The tokenizer's fields that only the summary shows, with their defaults.
_SUMMARY_FIELDS = {
    "eos_token": None, "bos_token": None, "eos_source": "", "bos_source": "", "eos_note": "",
}  # fmt: skip


class PlanError(ShardtokError):
    """plan.json or tokenizer.json is missing, damaged, edited, or from another shardtok."""


def plan_bytes(workdir: WorkDir) -> bytes:
    """plan.json as stored; a UsageError saying to plan first when there is none."""
    try:
        return workdir.folder.read_bytes(PLAN_NAME)
    except FileNotFoundError:
        raise UsageError(
            f"no plan in {workdir.output.display} ({workdir.folder.display_of(PLAN_NAME)} is "
            "missing): run `shardtok convert plan INPUT... -o OUTPUT` first"
        ) from None


def load_plan(workdir: WorkDir, data: bytes | None = None) -> Plan:
    """The plan in `workdir` (`data`: plan.json's bytes, when already read), with
    the tokenizer.json next to it; checked (PlanError, one line)."""
    if data is None:
        data = plan_bytes(workdir)
    try:
        backend = workdir.read_file(TOKENIZER_NAME)
    except FileNotFoundError:
        backend = None
    return parse_plan(data, backend, workdir.folder.display_of(PLAN_NAME))


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
            self.fail(name, f"must be {label}, got {short(value)}")
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
            self.fail(name, f"must be one of {shown}, got {short(value)}")
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
                self.fail(name, f"must map strings to strings, got {short({k: v})}")
        return dict(value)


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


def _read_piece(check: _Check, piece, where: str, files, version: int) -> InputRange:
    fields = 4 if version == 1 else 5
    if not (isinstance(piece, list) and len(piece) == fields):
        shape = "[input, start, end, row group" + ("]" if version == 1 else ", rows]")
        check.fail(where, f"must be {shape}")
    index = check.integer(piece, 0, 0, len(files) - 1, f"{where} input")
    file = files[index]
    start = check.integer(piece, 1, 0, file.size, f"{where} start")
    end = check.integer(piece, 2, start, file.size, f"{where} end")
    group = check.integer(piece, 3, 0, path=f"{where} row group", optional=True)
    if (group is not None) != (file.kind == "parquet"):
        check.fail(where, "has a row group for a file that is not Parquet, or none for one")
    rows = None
    if version > 1 and piece[4] is not None:
        pair = piece[4]
        if not (isinstance(pair, list) and len(pair) == 2):
            check.fail(f"{where} rows", "must be null or [first, stop]")
        first = check.integer(pair, 0, 0, path=f"{where} rows first")
        check.integer(pair, 1, first + 1, path=f"{where} rows stop")
        if file.kind not in ("parquet", "arrow"):
            check.fail(where, "has rows for a file that is neither Parquet nor Arrow")
        rows = (pair[0], pair[1])
    return InputRange(index, start, end, group, rows)


def _read_units(
    check: _Check, job: dict, files: tuple[InputFile, ...], version: int
) -> tuple[Unit, ...]:
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
        pieces = [
            _read_piece(check, piece, f"{at} piece {j}", files, version)
            for j, piece in enumerate(row[2])
        ]
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
        # (absent from plans of shardtok 0.3.0 and earlier)
        **{
            key: check.string(doc, key, at + key, optional=True) or default
            for key, default in _SUMMARY_FIELDS.items()
            if key in doc
        },
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


def job_from_json(doc: object, backend_json: bytes, where: str) -> ConvertJob:
    """The ConvertJob whose ``to_json()`` is `doc`, with `backend_json` its tokenizer's
    serialized backend, read as someone else's file: every field checked, the tokenizer's hash
    compared; a one-line PlanError names `where` and the field."""
    check = _Check(where)
    if not isinstance(doc, dict):
        raise PlanError(f"{where}: not a conversion job (a JSON object)")
    inputs = check.strings(doc, "inputs", "job.inputs")
    if not inputs:
        check.fail("job.inputs", "is empty")
    return _read_job(check, doc, backend_json, inputs, optional_unit_size=True)


def _read_job(check, job: dict, backend_json, inputs, optional_unit_size=False) -> ConvertJob:
    level = check.integer(job, "compression_level", 1, 22, "job.compression_level", optional=True)
    result = ConvertJob(
        inputs=tuple(inputs),
        output=check.string(job, "output", "job.output"),
        name=check.string(job, "name", "job.name"),
        text_key=check.string(job, "text_key", "job.text_key"),
        txt_mode=check.choice(job, "txt_mode", _TXT_MODES, "job.txt_mode"),
        on_bad_record=check.choice(job, "on_bad_record", _BAD_RECORD_MODES, "job.on_bad_record"),
        shard_size=check.integer(job, "shard_size", 1, path="job.shard_size"),
        compression_level=level,
        frame_size=check.integer(job, "frame_size", 1, path="job.frame_size"),
        unit_size=check.integer(
            job, "unit_size", 1, path="job.unit_size", optional=optional_unit_size
        ),
        tokenizer=_read_tokenizer(check, job, backend_json),
        sft=_read_sft(check, job),
    )
    problem = name_problem(result.name)
    if problem is not None:
        check.fail("job.name", problem)
    return result


def parse_plan(data: bytes, backend_json: bytes | None, where: str) -> Plan:
    """The Plan in plan.json's bytes `data`, with `backend_json` the bytes of tokenizer.json next
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
        check.fail("version", f"must be a positive integer, got {short(version)}")
    if version > PLAN_VERSION:
        raise PlanError(
            f"{where}: plan version {version} was written by a newer shardtok; this one reads "
            f"version {PLAN_VERSION}: upgrade shardtok here, or plan with this version"
        )
    job_doc = check.of(doc, "job", dict, "a mapping", "job")
    stored_fingerprint = check.of(doc, "fingerprint", dict, "a mapping", "fingerprint")
    if backend_json is None:
        raise PlanError(f"{where}: {TOKENIZER_NAME} is missing next to it: {_AGAIN}")
    files = _read_inputs(check, job_doc)
    txt_mode = check.choice(job_doc, "txt_mode", _TXT_MODES, "job.txt_mode")
    units = _read_units(check, job_doc, files, version)
    problem = coverage_problem(units, files, txt_mode)
    if problem is not None:
        check.fail(*problem)
    job = _read_job(check, job_doc, backend_json, [f.path for f in files])
    plan = Plan(
        job=job,
        base_dir=check.string(job_doc, "base_dir", "job.base_dir"),
        files=files,
        units=units,
        fingerprint=stored_fingerprint,
    )
    # The job must be the one fingerprinted: this also checks the chat template's text against
    # the hash the fingerprint records.
    expected = fingerprint(job, list(files))
    if PLAN_DIGEST in stored_fingerprint:  # (plans written before it are read without)
        units_json = [[u.index, u.nbytes, [p.to_json() for p in u.pieces]] for u in units]
        expected[PLAN_DIGEST] = plan_digest(job.name, units_json)
    if expected != stored_fingerprint:
        raise PlanError(
            f"{where}: the job disagrees with the plan's fingerprint (the plan is damaged or was "
            f"edited: {_AGAIN})"
        )
    return plan
