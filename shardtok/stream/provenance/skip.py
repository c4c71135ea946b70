"""Passing over the packed rows before a traced batch, as fast as the packers allow.

A trace replays a worker's stream up to its step, so this is where a trace spends its time.
Concat windows without overlap are passed over many at a time without being built
(``ConcatPacker.pass_windows``), also per source inside a mix (``MixedSequences.pass_rows``:
the schedule alone says how many rows each source serves). Everything else steps row by row
(greedy, bfd and overlapping windows decide row by row anyway).
"""

from __future__ import annotations

import numpy as np

from shardtok.stream.nodes.packer import Packer


def skip_rows(packer: Packer, rows: int) -> None:
    """Advance `packer` by `rows` rows, exactly as `rows` calls of ``next_into`` would (raising
    StopIteration where they would)."""
    if not packer._started:
        packer.reset(None)
    if getattr(packer, "passes_in_runs", False):  # a mix of such sources
        packer.pass_rows(rows)  # type: ignore[attr-defined]
    elif getattr(packer, "contiguous", False):  # concat windows without overlap
        if packer.pass_windows(rows) < rows:  # type: ignore[attr-defined]
            raise StopIteration
    else:
        scratch = np.empty(packer.window, dtype=np.int64)
        for _ in range(rows):
            packer.next_into(scratch)
