"""The ``--sft CONFIG.yaml`` settings, merged with their command-line overrides.

Every mistake is a one-line :class:`UsageError` naming the file (or the flag) and the key, found
before any worker starts: an unknown key (with the close match for a typo), a value of the wrong
type, or a key that does not apply to the chosen format (a ``role_map`` for ``alpaca`` would
otherwise be silently ignored, and the user would train on something else than they think).

The jq format takes the reference note's own keys as written (``special_tokens``,
``loss_masking_jq_patterns``, ``message_construction``) so its YAML works unchanged; the note
has no ``format:`` key, so those keys alone select the jq format.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from shardtok._safe_yaml import shown
from shardtok.errors import UsageError

FORMATS = ("sharegpt", "openai", "alpaca", "prompt_completion", "jq")
TRUNCATIONS = ("drop", "turns", "keep_start")
ROLES = ("system", "user", "assistant")

# Our field name -> the record's, per format (column_map overrides entries).
DEFAULT_COLUMNS = {
    "sharegpt": {"conversations": "conversations", "from": "from", "value": "value", "train": "train"},
    "openai": {"messages": "messages", "role": "role", "content": "content", "train": "train"},
    "alpaca": {"instruction": "instruction", "input": "input", "output": "output", "system": "system"},
    "prompt_completion": {"prompt": "prompt", "completion": "completion", "system": "system"},
}  # fmt: skip
DEFAULT_ROLES = {
    "sharegpt": {"human": "user", "gpt": "assistant", "system": "system"},
    "openai": {},
}
DEFAULT_TEMPLATES = {
    "sharegpt": "tokenizer",
    "openai": "tokenizer",
    "alpaca": "alpaca",
    "prompt_completion": "raw",
}

_COMMON = ("format", "train_on_input", "max_tokens", "truncation", "split_special_tokens")
_CHAT = ("column_map", "template", "train_roles")
_JQ = ("special_tokens", "loss_masking_jq_patterns", "message_construction", "separator")
KEYS = {
    "sharegpt": _COMMON + _CHAT + ("role_map",),
    "openai": _COMMON + _CHAT + ("role_map",),
    "alpaca": _COMMON + _CHAT,
    "prompt_completion": _COMMON + _CHAT,
    "jq": _COMMON + _JQ,
}
ALL_KEYS = tuple(dict.fromkeys(k for keys in KEYS.values() for k in keys))
# Command-line flag of each overridable key, for messages about a flag rather than the file.
FLAGS = {
    "format": "--sft-format",
    "template": "--chat-template",
    "train_on_input": "--train-on-input",
    "max_tokens": "--max-tokens",
    "truncation": "--truncation",
}


@dataclass(frozen=True)
class SFTConfig:
    """What turns a record into a training example (see docs/SFT.md). ``column_map`` and
    ``role_map`` are the effective maps: defaults with the user's entries applied."""

    format: str
    column_map: dict = field(default_factory=dict)
    role_map: dict = field(default_factory=dict)
    template: str | None = None
    train_on_input: bool = False
    train_roles: tuple[str, ...] = ("assistant",)
    max_tokens: int | None = None
    truncation: str = "drop"
    split_special_tokens: bool = False
    special_tokens: dict = field(default_factory=dict)  # jq: bos_token / eos_token strings
    loss_masking_jq_patterns: tuple[str, ...] = ()
    message_construction: tuple[str, ...] = ()
    separator: str = "\n"
    source: str = ""  # the YAML's path, for messages

    def column(self, name: str) -> str:
        return self.column_map[name]

    @property
    def bos_token(self) -> str:
        return self.special_tokens.get("bos_token") or ""

    @property
    def eos_token(self) -> str:
        return self.special_tokens.get("eos_token") or ""

    def record_fields(self) -> tuple[str, ...] | None:
        """Top-level fields a record is read for (Parquet reads only those columns); None:
        all of them (jq patterns may look anywhere)."""
        if self.format == "jq":
            return None
        # Both "a.b" and "a": a Parquet column may be named with a dot, or nest.
        names = [n for v in self.column_map.values() for n in (v, v.split(".")[0])]
        return tuple(dict.fromkeys(names))

    def as_metadata(self, template_name: str | None = None, template_source: str | None = None):
        """Every setting that decides the masks, as recorded in the manifest's ``sft`` (and in
        the resume plan, so work done under other settings is never reused)."""
        doc: dict = {"format": self.format}
        for key in KEYS[self.format]:
            if key == "format":
                continue
            value = getattr(self, key)
            doc[key] = list(value) if isinstance(value, tuple) else value
            doc[key] = dict(value) if isinstance(value, dict) else doc[key]
        if self.format != "jq":
            # `template` is what was asked for ("tokenizer", a path); the name and hash say
            # what it resolved to, so an edited template file is a different setting.
            doc["template_name"] = template_name
            doc["template_sha256"] = (
                hashlib.sha256(template_source.encode("utf-8")).hexdigest()
                if template_source is not None
                else None
            )
        return doc


def _fail(where: str, message: str):
    raise UsageError(f"{where}: {message}")


def _read_yaml(path: Path) -> dict:
    from shardtok import _safe_yaml as yaml  # aliases, nesting and integers bounded

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        _fail(str(path), f"cannot read the SFT config: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        _fail(str(path), f"the SFT config is not UTF-8 text (byte {exc.start})")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        _fail(str(path), f"not valid YAML{where}: {problem}")
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        _fail(str(path), f"the SFT config is a mapping of settings, not a {type(doc).__name__}")
    return doc


def _suggest(key: str, choices) -> str:
    close = difflib.get_close_matches(str(key), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Check:
    """Type checks that name the key and where it came from (the file, or a flag)."""

    def __init__(self, path: str, flags: set[str]):
        self.path = path
        self.flags = flags

    def where(self, key: str) -> str:
        return FLAGS[key] if key in self.flags else f"{self.path}: {shown(key)}"

    def fail(self, key: str, message: str):
        raise UsageError(f"{self.where(key)} {message}")

    def boolean(self, key: str, value) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {shown(value)}")
        return value

    def string(self, key: str, value, empty_ok: bool = False) -> str:
        if not isinstance(value, str) or (not value and not empty_ok):
            self.fail(
                key, f"must be a{'' if empty_ok else ' non-empty'} string, got {shown(value)}"
            )
        return value

    def choice(self, key: str, value, choices) -> str:
        if value not in choices:
            self.fail(
                key,
                f"must be one of {', '.join(choices)}, got {shown(value)}{_suggest(value, choices)}",
            )
        return value

    def mapping(self, key: str, value, keys=None, values=None) -> dict:
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, got {type(value).__name__}")
        out = {}
        for k, v in value.items():
            if keys is not None and k not in keys:
                self.fail(
                    key, f"has no entry {shown(k)}{_suggest(k, keys)}; it knows {', '.join(keys)}"
                )
            self.string(key, k)
            if values is not None and v not in values:
                self.fail(
                    key, f"maps {shown(k)} to {shown(v)}, which is not one of {', '.join(values)}"
                )
            if v is not None:
                self.string(key, v, empty_ok=key == "special_tokens")
            out[k] = v
        return out

    def strings(self, key: str, value, choices=None, empty_ok=True) -> tuple[str, ...]:
        if not isinstance(value, list) or (not value and not empty_ok):
            self.fail(key, f"must be a{'' if empty_ok else ' non-empty'} list, got {shown(value)}")
        for item in value:
            self.string(key, item)
            if choices is not None and item not in choices:
                self.fail(key, f"lists {shown(item)}, which is not one of {', '.join(choices)}")
        return tuple(value)


def load_sft_config(path: str | Path | None, overrides: dict | None = None) -> SFTConfig:
    """Read `path` (YAML, safely) and apply `overrides` (None values are left out). Without a
    path the overrides alone describe the records (``--sft-format openai --chat-template
    llama3``): the simple case needs no file."""
    flags = {k for k, v in (overrides or {}).items() if v is not None}
    if path is None:
        where, doc = "the command line", {}
        if "format" not in flags:
            given = ", ".join(FLAGS[k] for k in FLAGS if k in flags) or "fine-tuning data"
            raise UsageError(
                f"{given} needs the records' format: add --sft-format ({', '.join(FORMATS)}), "
                "or --sft CONFIG.yaml"
            )
    else:
        where = str(path)
        doc = _read_yaml(Path(path))
    for key in doc:
        if key not in ALL_KEYS:
            _fail(where, f"unknown key {shown(key)}{_suggest(key, ALL_KEYS)}")
    doc.update({k: (overrides or {})[k] for k in flags})
    check = _Check(where, flags)
    if "format" not in doc:
        if any(k in doc for k in _JQ):
            doc["format"] = "jq"  # the reference note's YAML, as written
        else:
            _fail(where, f"no 'format': add one of {', '.join(FORMATS)} (or pass --sft-format)")
    fmt = check.choice("format", doc["format"], FORMATS)
    for key in doc:
        if key not in KEYS[fmt]:
            check.fail(key, f"does not apply to format {fmt}")
    settings: dict = {"format": fmt, "source": where}
    for key in ("train_on_input", "split_special_tokens"):
        if key in doc:
            settings[key] = check.boolean(key, doc[key])
    if doc.get("max_tokens") is not None:
        value = doc["max_tokens"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            check.fail("max_tokens", f"must be a positive integer (or null), got {shown(value)}")
        settings["max_tokens"] = value
    if "truncation" in doc:
        settings["truncation"] = check.choice("truncation", doc["truncation"], TRUNCATIONS)
    if fmt == "jq":
        return _jq_config(doc, check, settings)
    columns = dict(DEFAULT_COLUMNS[fmt])
    if "column_map" in doc:
        columns.update(check.mapping("column_map", doc["column_map"], keys=tuple(columns)))
    settings["column_map"] = columns
    if fmt in DEFAULT_ROLES:
        roles = {r: r for r in ROLES} | DEFAULT_ROLES[fmt]
        if "role_map" in doc:
            roles.update(check.mapping("role_map", doc["role_map"], values=ROLES))
        settings["role_map"] = roles
    settings["template"] = check.string("template", doc.get("template", DEFAULT_TEMPLATES[fmt]))
    if "train_roles" in doc:
        settings["train_roles"] = check.strings("train_roles", doc["train_roles"], ROLES, False)
    return SFTConfig(**settings)


def _jq_config(doc: dict, check: _Check, settings: dict) -> SFTConfig:
    if "message_construction" not in doc:
        check.fail(
            "format",
            "jq needs 'message_construction' (in an --sft CONFIG.yaml): the record's keys to "
            "render, in order",
        )
    settings["message_construction"] = check.strings(
        "message_construction", doc["message_construction"], empty_ok=False
    )
    if "loss_masking_jq_patterns" in doc:
        settings["loss_masking_jq_patterns"] = check.strings(
            "loss_masking_jq_patterns", doc["loss_masking_jq_patterns"]
        )
    if doc.get("special_tokens") is not None:
        settings["special_tokens"] = check.mapping(
            "special_tokens", doc["special_tokens"], keys=("bos_token", "eos_token")
        )
    if "separator" in doc:
        settings["separator"] = check.string("separator", doc["separator"], empty_ok=True)
    return SFTConfig(**settings)
