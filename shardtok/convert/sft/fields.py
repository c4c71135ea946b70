"""Checks of a record's values shared by every format (formats.py and the jq format)."""

from __future__ import annotations

from shardtok.convert.inputs.records import INVALID_UTF8
from shardtok.convert.sft.conversation import INVALID_CONVERSATION, SFTBad


def check_text(value, what: str) -> str | SFTBad:
    if not isinstance(value, str):
        kind = "null" if value is None else f"a {type(value).__name__}"
        return SFTBad(INVALID_CONVERSATION, f"{what} is {kind}, not a string")
    try:
        value.encode("utf-8")  # JSON escapes can carry lone surrogates no tokenizer accepts
    except UnicodeEncodeError as exc:
        return SFTBad(INVALID_UTF8, f"{what}: {exc.reason} at character {exc.start}")
    return value


def train_flag(value, what: str) -> bool | None | SFTBad:
    if value is None or isinstance(value, bool):
        return value
    return SFTBad(INVALID_CONVERSATION, f"{what}: 'train' is {value!r}, not true or false")
