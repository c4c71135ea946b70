"""A raw record (a parsed JSON line or Parquet row) to a :class:`Conversation`, or why not.

Formats: ``sharegpt`` (``conversations: [{from, value}]``), ``openai`` (``messages: [{role,
content}]``), ``alpaca`` (``instruction``, ``input``, ``output``, optional ``system``),
``prompt_completion`` (``prompt``, ``completion``, optional ``system``) and ``jq`` (see
jq_patterns.py). ``column_map`` renames the fields, ``role_map`` the roles; a message's boolean
``train`` key overrides whether it is trained. Whatever a record gets wrong is an
:class:`SFTBad` whose detail names the message, so a user can find it in a million-line file.
"""

from __future__ import annotations

from collections.abc import Callable

from shardtok.convert.inputs.records import MISSING_FIELD
from shardtok.convert.sft.config import ROLES, SFTConfig
from shardtok.convert.sft.conversation import (
    INVALID_CONVERSATION,
    NOT_A_LIST,
    UNKNOWN_ROLE,
    Conversation,
    Message,
    SFTBad,
)
from shardtok.convert.sft.fields import check_text, train_flag

Converter = Callable[[object], "Conversation | SFTBad"]

_MISSING = object()


def _get(record: dict, name: str):
    """The record's field `name` (a.b reaches nested objects), or _MISSING."""
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _field(record: dict, name: str):
    value = _get(record, name)
    if value is _MISSING:
        return SFTBad(MISSING_FIELD, f"no field {name!r}")
    if value is None:
        return SFTBad(MISSING_FIELD, f"field {name!r} is null")
    return value


def _finish(messages: list[Message]) -> Conversation | SFTBad:
    if not any(m.role == "assistant" for m in messages):
        return SFTBad(INVALID_CONVERSATION, "no assistant message: nothing to learn from")
    return Conversation(tuple(messages))


class _Chat:
    """sharegpt and openai: a list of message objects with a role and a content field."""

    def __init__(self, config: SFTConfig, list_key: str, role_key: str, content_key: str):
        self.list_field = config.column(list_key)
        self.role_field = config.column(role_key)
        self.content_field = config.column(content_key)
        self.train_field = config.column("train")
        self.roles = dict(config.role_map)
        # Shown in unknown_role details: what a record may say, mapped roles first.
        self.known = ", ".join(dict.fromkeys([*self.roles, *ROLES]))

    def __call__(self, record) -> Conversation | SFTBad:
        if not isinstance(record, dict):
            return SFTBad(
                INVALID_CONVERSATION, f"the record is a {type(record).__name__}, not an object"
            )
        turns = _field(record, self.list_field)
        if isinstance(turns, SFTBad):
            return turns
        if not isinstance(turns, list):
            return SFTBad(
                NOT_A_LIST, f"field {self.list_field!r} is a {type(turns).__name__}, not a list"
            )
        if not turns:
            return SFTBad(INVALID_CONVERSATION, f"field {self.list_field!r} is an empty list")
        messages = []
        for i, turn in enumerate(turns):
            what = f"message {i}"
            if not isinstance(turn, dict):
                return SFTBad(
                    INVALID_CONVERSATION, f"{what} is a {type(turn).__name__}, not an object"
                )
            if self.role_field not in turn:
                return SFTBad(INVALID_CONVERSATION, f"{what} has no {self.role_field!r}")
            role = turn[self.role_field]
            if not isinstance(role, str):
                return SFTBad(
                    INVALID_CONVERSATION, f"{what}: {self.role_field!r} is {role!r}, not a string"
                )
            canonical = self.roles.get(role)
            if canonical is None:
                return SFTBad(
                    UNKNOWN_ROLE,
                    f"{what}: role {role!r} is not one of {self.known} (add it to role_map)",
                )
            if self.content_field not in turn:
                return SFTBad(INVALID_CONVERSATION, f"{what} has no {self.content_field!r}")
            content = check_text(turn[self.content_field], f"{what}: {self.content_field!r}")
            train = train_flag(turn.get(self.train_field), what)
            if isinstance(content, SFTBad):
                return content
            if isinstance(train, SFTBad):
                return train
            messages.append(Message(canonical, content, train))
        return _finish(messages)


class _Fields:
    """alpaca and prompt_completion: fixed fields, one user and one assistant message."""

    def __init__(self, config: SFTConfig):
        self.alpaca = config.format == "alpaca"
        cols = config.column_map
        self.user = cols["instruction" if self.alpaca else "prompt"]
        self.input = cols.get("input")
        self.assistant = cols["output" if self.alpaca else "completion"]
        self.system = cols["system"]

    def __call__(self, record) -> Conversation | SFTBad:
        if not isinstance(record, dict):
            return SFTBad(
                INVALID_CONVERSATION, f"the record is a {type(record).__name__}, not an object"
            )
        messages = []
        system = _get(record, self.system)
        if system is not _MISSING and system is not None:
            system = check_text(system, f"field {self.system!r}")
            if isinstance(system, SFTBad):
                return system
            messages.append(Message("system", system))
        parts = []
        for name in (self.user, self.assistant):
            value = _field(record, name)
            if not isinstance(value, SFTBad):
                value = check_text(value, f"field {name!r}")
            if isinstance(value, SFTBad):
                return value
            parts.append(value)
        prompt, answer = parts
        if self.alpaca:
            extra = _get(record, self.input)
            if extra is not _MISSING and extra is not None:
                extra = check_text(extra, f"field {self.input!r}")
                if isinstance(extra, SFTBad):
                    return extra
                if extra:
                    prompt = prompt + "\n\n" + extra
        messages.append(Message("user", prompt))
        messages.append(Message("assistant", answer))
        return Conversation(tuple(messages))


def make_converter(config: SFTConfig) -> Converter:
    """The record-to-Conversation function for `config` (built once per worker: the jq format
    compiles its patterns here)."""
    if config.format == "sharegpt":
        return _Chat(config, "conversations", "from", "value")
    if config.format == "openai":
        return _Chat(config, "messages", "role", "content")
    if config.format == "jq":
        from shardtok.convert.sft.jq_patterns import JqFormat  # jq is imported only here

        return JqFormat(config)
    return _Fields(config)


def to_conversation(record, config: SFTConfig) -> Conversation | SFTBad:
    """One record; loops should keep :func:`make_converter`'s result instead."""
    return make_converter(config)(record)
