"""Saved stream positions on disk: one JSON file for the worker streams of one rank.

The file holds every worker stream's state (small, positions and counters only), which worker
the DataLoader's round robin serves next, how many batches were taken, and the fingerprint of
the sources and options. It is written to a temporary name and renamed, so a job killed while
saving leaves the previous file intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardtok.errors import ResumeStateError

STATE_FORMAT = "shardtok-stream-state"
STATE_VERSION = 1


def save_state_file(
    path: str | Path,
    *,
    fingerprint: dict,
    workers: list[dict],
    next_worker: int,
    batches: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
) -> Path:
    path = Path(path)
    doc = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "epoch": epoch,
        "rank": rank,
        "world_size": world_size,
        "batches": batches,
        "next_worker": next_worker,
        "workers": workers,
        "fingerprint": fingerprint,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_state_file(path: str | Path) -> dict:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeStateError(f"{path}: cannot read the stream state: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise ResumeStateError(f"{path}: not a shardtok stream state file")
    if doc.get("version") != STATE_VERSION:
        raise ResumeStateError(
            f"{path}: stream state version {doc.get('version')}, this shardtok reads {STATE_VERSION}"
        )
    return doc
