"""The state envelope: every saved position is ``{"format", "version", "kind", ...}``.

Every state shardtok hands out (a node's, a placed stream's, a dataset worker's, a merged
elastic state, a loader's, the CLI's state file) is a JSON object::

    {"format": "shardtok.state", "version": 2, "kind": "reader", "group": 0, "ordinal": 3, ...}

Its kind says what it is, so no code guesses a state's meaning from which keys are present, and
every field is checked once, here, when a state is restored: a missing or unknown field, a wrong
type or a negative count is a ``ResumeStateError`` naming the kind and the field. Each node owns
its kind and field list (``KIND``/``FIELDS`` on the class) and checks ranges that only it knows.

What shardtok 0.1 wrote had no envelope (call it version 1); 0.3 was the last release to
upgrade such states, and this one refuses them in one line naming that version. A version newer
than this release's is refused with both versions named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from shardtok.errors import ResumeStateError

FORMAT = "shardtok.state"
VERSION = 2
ENVELOPE = ("format", "version", "kind")
LEGACY_FILE_FORMAT = "shardtok-stream-state"  # the CLI's state file of shardtok 0.1
UNVERSIONED = (
    "this state was saved by shardtok 0.1 (it has no version), which this release no longer "
    "resumes: 0.3 was the last release to upgrade such states; finish that run with shardtok 0.3"
)

# Field types. A field's value is checked against one of these before a node sees it.
INT = "a non-negative integer"
BOOL = "true or false"
STATE = "a state object"
OPTIONAL_STATE = "a state object or null"
LIST = "a list"
OBJECT = "an object"
OPTIONAL_OBJECT = "an object or null"
ANY = "any JSON value"


def wrap(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A state of `kind` holding `fields` (the envelope first, for readable JSON)."""
    return {"format": FORMAT, "version": VERSION, "kind": kind, **fields}


def is_enveloped(state: object) -> bool:
    return isinstance(state, Mapping) and "format" in state


def check_version(state: Mapping, what: str) -> None:
    """Refuse anything but a shardtok state of a version this release reads."""
    if not is_enveloped(state) or state.get("format") == LEGACY_FILE_FORMAT:
        raise ResumeStateError(UNVERSIONED)
    if state.get("format") != FORMAT:
        raise ResumeStateError(
            f"{what}: not a shardtok state (format {state.get('format')!r}, expected {FORMAT!r})"
        )
    version = state.get("version")
    if version != VERSION:
        raise ResumeStateError(
            f"{what}: state version {version!r} was written by another shardtok release; this "
            f"one reads version {VERSION}"
        )


def parse(
    state: object,
    kind: str | tuple[str, ...],
    fields: Mapping[str, str],
    optional: tuple[str, ...] = (),
) -> dict:
    """Check `state` is a current-version state of `kind` with exactly `fields` (those in
    `optional` may be absent); return it.

    `kind` may be a tuple of accepted kinds (the caller then branches on ``state["kind"]``).
    """
    kinds = (kind,) if isinstance(kind, str) else kind
    name = "/".join(kinds)
    if not isinstance(state, Mapping):
        raise ResumeStateError(f"{name} state: expected a JSON object, got {type(state).__name__}")
    check_version(state, f"{name} state")
    if state.get("kind") not in kinds:
        raise ResumeStateError(f"expected a {name} state, got a {state.get('kind')!r} state")
    name = str(state["kind"])
    missing = [f for f in fields if f not in state and f not in optional]
    unknown = [k for k in state if k not in fields and k not in ENVELOPE]
    if missing:
        raise ResumeStateError(f"{name} state: field {missing[0]!r} is missing")
    if unknown:
        raise ResumeStateError(f"{name} state: unknown field {unknown[0]!r}")
    for field, expected in fields.items():
        if field in state and not _matches(state[field], expected):
            raise ResumeStateError(
                f"{name} state: field {field!r} must be {expected}, got {state[field]!r:.80}"
            )
    return dict(state)


def _matches(value: object, expected: str) -> bool:
    if expected == INT:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if expected == BOOL:
        return isinstance(value, bool)
    if expected in (STATE, OBJECT):
        return isinstance(value, Mapping)
    if expected in (OPTIONAL_STATE, OPTIONAL_OBJECT):
        return value is None or isinstance(value, Mapping)
    if expected == LIST:
        return isinstance(value, list)
    return expected == ANY


def check_range(kind: str, field: str, value: int, low: int, high: int | float) -> int:
    """`value` within [low, high], else a ResumeStateError naming the field."""
    if not low <= value <= high:
        bound = "" if math.isinf(high) else f", at most {high}"
        raise ResumeStateError(
            f"{kind} state: field {field!r} is {value}, outside this stream (at least {low}{bound})"
        )
    return value


def non_negative_ints(kind: str, field: str, values: object, length: int | None = None) -> list:
    """A list of non-negative integers (of `length`, when given), else a ResumeStateError."""
    if not isinstance(values, list) or not all(_matches(v, INT) for v in values):
        raise ResumeStateError(
            f"{kind} state: field {field!r} must be a list of non-negative integers"
        )
    if length is not None and len(values) != length:
        raise ResumeStateError(
            f"{kind} state: field {field!r} has {len(values)} entries, expected {length}"
        )
    return values
