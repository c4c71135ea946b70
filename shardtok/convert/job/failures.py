"""Why a unit stops a conversion, and its failure marker (``unit-NNNNNN.failed.json``).

A worker that meets its unit's first bad record under ``--on-bad-record error``, or a text the
two tokenizer backends encode differently, persists the failure so whoever drives the phases
can report it without redoing the unit. The marker records the mode that found it: a bad record
stops an ``error`` run only, so a ``skip`` run never takes it for its own. The marker may be
anyone's file: it is JSON, and every field is checked when read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_FORMAT = "shardtok.unit-failure"


@dataclass(frozen=True)
class UnitFailure:
    """The first bad record of a unit, under --on-bad-record error."""

    index: int
    piece: int
    record: int
    reason: str
    detail: str


@dataclass(frozen=True)
class EncoderMismatch:
    """The tiktoken canary found a text that tokenizers encodes differently (stops the run)."""

    index: int
    piece: int
    record: int
    detail: str


def stops(failure: UnitFailure | EncoderMismatch | None, on_bad_record: str, backend: str) -> bool:
    """Whether a recorded failure stops a job with this --on-bad-record mode and tokenizer
    backend; else its unit is tokenized again. A bad record stops an ``error`` job only, and a
    tiktoken mismatch a job that encodes with tiktoken only (the plan may have changed either
    since the failure was recorded, keeping the units)."""
    if isinstance(failure, UnitFailure):
        return on_bad_record == "error"
    if isinstance(failure, EncoderMismatch):
        return backend == "tiktoken"
    return False


def failure_to_json(failure: UnitFailure | EncoderMismatch, stop_at_bad_record: bool) -> bytes:
    doc = {
        "format": _FORMAT,
        "version": 1,
        "index": failure.index,
        "piece": failure.piece,
        "record": failure.record,
        "detail": failure.detail,
        "stop_at_bad_record": bool(stop_at_bad_record),
    }
    if isinstance(failure, UnitFailure):
        doc.update(kind="bad_record", reason=failure.reason)
    else:
        doc["kind"] = "encoder_mismatch"
    return json.dumps(doc, sort_keys=True).encode()


def _count(value) -> bool:
    return type(value) is int and value >= 0


def failure_from_json(data: bytes, index: int) -> tuple[UnitFailure | EncoderMismatch, bool] | None:
    """(the failure, stop_at_bad_record of the run that found it), or None unless `data` is a
    well-formed failure marker of unit `index`."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("version") != 1:
        return None
    piece, record, detail = doc.get("piece"), doc.get("record"), doc.get("detail")
    mode = doc.get("stop_at_bad_record")
    if doc.get("index") != index or type(doc.get("index")) is not int:
        return None
    if not (_count(piece) and _count(record) and isinstance(detail, str) and type(mode) is bool):
        return None
    if doc.get("kind") == "bad_record" and isinstance(doc.get("reason"), str):
        return UnitFailure(index, piece, record, doc["reason"], detail), mode
    if doc.get("kind") == "encoder_mismatch":
        return EncoderMismatch(index, piece, record, detail), mode
    return None
