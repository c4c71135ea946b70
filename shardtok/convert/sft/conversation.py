"""The two values passed between the SFT stages: what a record says, and what it renders to."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Message:
    """One turn after column_map/role_map: a canonical role, its text, and an optional
    per-message override of the trained-or-not default (``train: true|false`` in the record)."""

    role: str
    content: str
    train: bool | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """The messages of one record, in order. ``system``, ``user``, ``assistant`` are the roles
    chat templates know; the jq format uses its own piece names (``role``, ``instruction``,
    ``human``, ``gpt``...) and always sets ``train`` on every message."""

    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Rendered:
    """One record rendered to the single string that is encoded once.

    ``trained``: character spans ``[start, end)`` whose tokens are training targets (sorted,
    non-overlapping). ``content``: character spans that came from the record's own text
    (message contents), where a special-token string is a bad record unless content is encoded
    with special tokens split; everything else is template text. ``turns``: ``(start, end, trained)`` per message
    in order, covering that message's whole turn (header, content, end-of-turn text), used by
    ``truncation: turns``.
    """

    text: str
    trained: tuple[tuple[int, int], ...]
    content: tuple[tuple[int, int], ...] = field(default=())
    turns: tuple[tuple[int, int, bool], ...] = field(default=())


# Bad-record reasons of SFT records (stable names: rejects.jsonl and the manifest count them).
NOT_A_LIST = "not_a_list"
UNKNOWN_ROLE = "unknown_role"
INVALID_CONVERSATION = "invalid_conversation"
JQ_ERROR = "jq_error"
SPECIAL_TOKEN_IN_CONTENT = "special_token_in_content"
NO_LOSS_TOKENS = "no_loss_tokens"
TOO_LONG = "too_long"


@dataclass(frozen=True, slots=True)
class SFTBad:
    """Why one record cannot become a training example (the caller adds file and line)."""

    reason: str
    detail: str


def merge_spans(spans) -> tuple[tuple[int, int], ...]:
    """Character spans sorted, with empty ones dropped and touching or overlapping ones joined:
    the form ``Rendered.trained`` takes, from any renderer."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if merged and merged[-1][1] >= start:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((a, b) for a, b in merged)
