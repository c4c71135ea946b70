"""The window a source packs with (``seq_len``, ``stride``), as its state records it.

A source's position is only meaningful in the window it was packed in: a curriculum stage with
its own ``seq_len`` restores a source into another one, which then packs the rest of its epoch
anew (``SourceSequences``); a merge of another layout's states plans each old slice with its own.
"""

from __future__ import annotations

from dataclasses import replace

from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.options import StreamOptions


def window_of(options: StreamOptions) -> dict:
    """The window a source packs with, as its state records it."""
    return {"seq_len": options.seq_len, "stride": options.stride}


def with_window(options: StreamOptions, window: dict) -> StreamOptions:
    """`options` packing with a saved `window` (refused in one line when damaged)."""
    if not isinstance(window, dict) or set(window) != {"seq_len", "stride"}:
        raise ResumeStateError("source_sequences state: a window must be {'seq_len', 'stride'}")
    try:
        return replace(options, **window)
    except (UsageError, TypeError) as exc:
        raise ResumeStateError(f"source_sequences state: window {window}: {exc}") from None


def saved_window(saved: dict) -> dict:
    """A ``repack`` entry's window (its other field is the packer state at the switch)."""
    return {k: v for k, v in saved.items() if k != "packer"}


def same_window(a: StreamOptions, b: StreamOptions) -> bool:
    return (a.seq_len, a.stride or a.seq_len + 1) == (b.seq_len, b.stride or b.seq_len + 1)
