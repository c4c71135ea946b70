"""The jq format: ``loss_masking_jq_patterns`` decide which rendered pieces are excluded.

Each pattern is evaluated as ``path(<pattern>)``, which yields the exact locations it selects
(``["conversations", 0]``, ``["instruction"]``) rather than copies of the values: two equal
human turns are then never confused, and a selected piece is known by where it is.

The reference note's own pattern, ``.conversations | select(.from == "human")``, is not valid
for a list in real jq ("Cannot index array with string"); its intent is plainly
``.conversations[] | select(...)``. A pattern that fails that way is retried with ``[]`` after
its leading path, and a note says so once. Every record evaluates the pattern as written first
and the rewrite only on that failure, so a record's result never depends on which records a
worker happened to see before it (output stays identical for any worker count).
"""

from __future__ import annotations

import re

from shardtok.convert.records import MISSING_FIELD
from shardtok.convert.sft.config import SFTConfig
from shardtok.convert.sft.conversation import (
    INVALID_CONVERSATION,
    JQ_ERROR,
    Conversation,
    Message,
    SFTBad,
)
from shardtok.convert.sft.fields import check_text, train_flag
from shardtok.errors import UsageError

_ARRAY_INDEX = "Cannot index array with"
# A leading path of plain steps (.a, ."a b", .["a"], [0]) followed by a top-level pipe.
_LEADING_PATH = re.compile(
    r'\s*((?:\.[A-Za-z_][A-Za-z0-9_]*|\."(?:[^"\\]|\\.)*"|\.?\["(?:[^"\\]|\\.)*"\]|\[\d+\])+)'
    r"\s*\|(.*)",
    re.DOTALL,
)


def rewrite(pattern: str) -> str | None:
    """`pattern` with ``[]`` after its leading path (``.a | f`` -> ``.a[] | f``), or None."""
    match = _LEADING_PATH.fullmatch(pattern)
    if match is None:
        return None
    return f"{match.group(1)}[] | {match.group(2).strip()}"


def _compile(pattern: str, where: str):
    import jq

    try:
        return jq.compile(f"path({pattern})")
    except ValueError as exc:
        # Positions would count the path( ) wrapper: keep only what is wrong.
        first = str(exc).splitlines()[0].removeprefix("jq: error: ").split(" at <top-level>")[0]
        raise UsageError(f"{where}: invalid jq pattern {pattern!r}: {first}") from None


def _error(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class JqPatterns:
    """The compiled patterns; :meth:`excluded` gives the paths a record's patterns select.

    ``rewrites`` lists ``(pattern, rewrite)`` for each pattern that needed its rewrite so far
    (the caller prints the note once for the run)."""

    def __init__(self, patterns: tuple[str, ...], where: str = "loss_masking_jq_patterns"):
        self.patterns = tuple(patterns)
        self._compiled = [_compile(p, where) for p in self.patterns]
        self._rewrites: dict[int, object] = {}
        self.rewrites: list[tuple[str, str]] = []

    def _retry(self, index: int, record, first: Exception) -> list | SFTBad:
        pattern = self.patterns[index]
        failed = f"pattern {pattern!r}: {_error(first)}"
        if not isinstance(first, ValueError) or _ARRAY_INDEX not in str(first):
            return SFTBad(JQ_ERROR, failed)
        if index not in self._rewrites:
            other = rewrite(pattern)
            self._rewrites[index] = None if other is None else (other, _compile(other, ""))
        if self._rewrites[index] is None:
            return SFTBad(JQ_ERROR, failed)
        other, compiled = self._rewrites[index]
        try:
            result = compiled.input_value(record).all()
        except Exception as exc:
            return SFTBad(JQ_ERROR, f"{failed}; retried as {other!r}: {_error(exc)}")
        if (pattern, other) not in self.rewrites:
            self.rewrites.append((pattern, other))
        return result

    def excluded(self, record) -> list[list] | SFTBad:
        paths: list[list] = []
        for index, compiled in enumerate(self._compiled):
            try:
                found = compiled.input_value(record).all()
            except Exception as exc:  # jq raises ValueError; odd Parquet values a TypeError
                found = self._retry(index, record, exc)
                if isinstance(found, SFTBad):
                    return found
            paths.extend(found)
        return paths


def _covers(selected: list, piece: tuple) -> bool:
    """Whether a selected path covers the piece at `piece`: one is a prefix of the other (a
    selected message field excludes its message); a slice step covers the indices in it."""
    for step, at in zip(selected, piece):
        if isinstance(step, dict) and isinstance(at, int):
            start, end = step.get("start"), step.get("end")
            if (start is not None and at < start) or (end is not None and at >= end):
                return False
        elif step != at:
            return False
    return True


class JqFormat:
    """A record to the pieces ``message_construction`` names, in order: a string field is one
    piece, a list of message objects (``value`` or ``content``) one piece per message. A
    piece's role is its key, or the message's ``from``/``role``; ``train`` is False for the
    pieces a pattern selects (unless ``train_on_input``), or the message's own ``train``."""

    def __init__(self, config: SFTConfig):
        self.keys = config.message_construction
        self.train_all = config.train_on_input
        self.patterns = JqPatterns(config.loss_masking_jq_patterns, config.source)

    @property
    def rewrites(self) -> list[tuple[str, str]]:
        return self.patterns.rewrites

    def __call__(self, record) -> Conversation | SFTBad:
        if not isinstance(record, dict):
            return SFTBad(
                INVALID_CONVERSATION, f"the record is a {type(record).__name__}, not an object"
            )
        selected = self.patterns.excluded(record)
        if isinstance(selected, SFTBad):
            return selected

        def train(at: tuple, own=None) -> bool:
            if own is not None:
                return own
            return self.train_all or not any(_covers(s, at) for s in selected)

        messages = []
        for key in self.keys:
            value = record.get(key)
            if value is None:
                continue  # the note's extra keys (instruction, role) are optional
            if isinstance(value, str):
                text = check_text(value, f"field {key!r}")
                if isinstance(text, SFTBad):
                    return text
                messages.append(Message(key, text, train((key,))))
                continue
            if not isinstance(value, list):
                return SFTBad(
                    INVALID_CONVERSATION,
                    f"field {key!r} is a {type(value).__name__}: message_construction renders "
                    "strings and lists of messages",
                )
            for i, item in enumerate(value):
                piece = _message(key, i, item)
                if isinstance(piece, SFTBad):
                    return piece
                role, content, own = piece
                messages.append(Message(role, content, train((key, i), own)))
        if not messages:
            return SFTBad(MISSING_FIELD, f"none of the fields {', '.join(self.keys)} is present")
        return Conversation(tuple(messages))


def _message(key: str, i: int, item) -> tuple[str, str, bool | None] | SFTBad:
    what = f"{key}[{i}]"
    if not isinstance(item, dict):
        return SFTBad(INVALID_CONVERSATION, f"{what} is a {type(item).__name__}, not an object")
    field = "value" if "value" in item else "content"
    if field not in item:
        return SFTBad(INVALID_CONVERSATION, f"{what} has neither 'value' nor 'content'")
    content = check_text(item[field], f"{what}: {field!r}")
    if isinstance(content, SFTBad):
        return content
    role = item.get("from", item.get("role", key))
    if not isinstance(role, str):
        return SFTBad(INVALID_CONVERSATION, f"{what}: role {role!r} is not a string")
    own = train_flag(item.get("train"), what)
    if isinstance(own, SFTBad):
        return own
    return role, content, own
