"""Passing over the packed rows before a traced batch, as fast as the packers allow.

A trace replays a worker's stream up to its step, so this is where a trace spends its time.
Concat windows without overlap are cut many at a time (``ConcatPacker.next_batch``), also per
source inside a mix: sources are independent streams and the schedule alone says how many rows
each serves in a run of steps, so each source passes over its share at once. Everything else
steps row by row (greedy, bfd and overlapping windows decide row by row anyway).
"""

from __future__ import annotations

import numpy as np

from shardtok.stream.mix.sequences import MixedSequences, SourceSequences
from shardtok.stream.nodes.packer import Packer

SKIP_TOKENS = 1 << 22  # tokens of windows cut per next_batch call (32 MiB of addresses)


def skip_rows(packer: Packer, rows: int) -> None:
    """Advance `packer` by `rows` rows, exactly as `rows` calls of ``next_into`` would."""
    if not packer._started:
        packer.reset(None)
    if isinstance(packer, MixedSequences) and all(map(_contiguous, packer.sources)):
        schedule = packer.schedule
        shares = np.subtract(schedule.counts(packer.step + rows), schedule.counts(packer.step))
        for source, count in zip(packer.sources, shares.tolist()):
            _skip_source(source, count)
        packer.step += rows
        return
    scratch = np.empty(packer.window, dtype=np.int64)
    if getattr(packer, "contiguous", False):
        _skip_windows(packer, rows, lambda: packer.next_into(scratch))
    else:
        for _ in range(rows):
            packer.next_into(scratch)


def _contiguous(source: SourceSequences) -> bool:
    options = source.options
    return options.packing == "concat" and options.stride in (None, source.window)


def _skip_source(source: SourceSequences, rows: int) -> None:
    if not source._started:
        source.reset(None)
    scratch = np.empty(source.window, dtype=np.int64)

    def one_row() -> None:  # the source's own step: it opens its next epoch when one ends
        source.next_into(scratch)

    while rows:
        packer = source._packer
        assert packer is not None
        done = _skip_windows(packer, rows, one_row, stop_at_end=True)
        source.sequences += done
        source.epoch_real_tokens += done * source.window
        rows -= done
        if rows:  # this epoch's windows are spent: the next row opens the next epoch
            one_row()
            rows -= 1


def _skip_windows(packer, rows: int, one_row, stop_at_end: bool = False) -> int:
    """Cut `rows` contiguous windows, a run at a time; near the end of the data, runs halve.
    Returns the windows cut (with `stop_at_end`, fewer when the packer's data ends)."""
    run = max(1, SKIP_TOKENS // packer.window)
    done = 0
    while done < rows:
        take = min(run, rows - done)
        if packer.next_batch(take) is not None:
            done += take
        elif take > 1:
            run = take // 2
        elif stop_at_end:
            return done
        else:
            one_row()  # raises StopIteration at the end of the stream
            done += 1
    return done
