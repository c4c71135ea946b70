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
    non-overlapping). ``template``: character spans that came from template text, the only
    places a special-token string may appear. ``turns``: ``(start, end, trained)`` per message
    in order, covering that message's whole turn (header, content, end-of-turn text), used by
    ``truncation: turns``.
    """

    text: str
    trained: tuple[tuple[int, int], ...]
    template: tuple[tuple[int, int], ...] = field(default=())
    turns: tuple[tuple[int, int, bool], ...] = field(default=())
