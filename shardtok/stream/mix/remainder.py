"""Elastic resume of a weighted mix: every source finishes its current epochs in the new layout.

Each old (rank, worker) is, for every source, somewhere in its own current source epoch (workers
move through a source's epochs independently). For each source, the residual streams of all old
slices (each in its own epoch; the rule of ``stream/remainder.py``) are joined in old-slice order and cut
into the new ``world_size * num_workers`` slices; a new worker packs its share of every source's
remainder first and then continues that source with epoch ``max(old epochs) + 1`` in the new
layout. The mixing schedule restarts at step 0 in every new worker, so the weights hold from the
resume on. No document of an old slice's current epoch is repeated or skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.index.slices import cut_ranges
from shardtok.stream.build import packer_for, plan_for
from shardtok.stream.mix.sequences import MixedSequences
from shardtok.stream.mix.source import SourceSequences
from shardtok.stream.mix.window import with_window
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.nodes.packer import Packer
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import EpochPlan
from shardtok.stream.remainder import (
    RemainderDocuments,
    check_layout,
    check_progress,
    residual_documents,
    residual_tokens,
    saved_options,
    slice_progress,
)


def merge_mixed_states(
    streams: list[dict | None], world_size: int, num_workers: int, epoch: int
) -> dict:
    """Per source and old slice (in slice order): the source epoch and that epoch's progress."""
    positions: list[list[dict | None]] | None = None
    for index, stream in enumerate(streams):
        if stream is None:
            continue
        per_source = MixedSequences.source_states(Batcher.progress(stream["batcher"])[0])
        if positions is None:
            positions = [[None] * len(streams) for _ in per_source]
        for i, source_state in enumerate(per_source):
            positions[i][index] = source_state
    if positions is None:
        raise ResumeStateError("merge_states: no worker of this mix had started")
    return merge_source_positions(positions, world_size, num_workers, epoch)


def merge_source_positions(
    positions: list[list[dict | None]], world_size: int, num_workers: int, epoch: int
) -> dict:
    """The merged layout of sources whose every old slice's ``source_sequences`` state is
    `positions[source][slice]` (None: that slice never read the source: its epoch `epoch`,
    untouched)."""
    sources = []
    for per_slice in positions:
        merged = []
        for state in per_slice:
            if state is None:
                merged.append({"epoch": epoch, **slice_progress(None, 0)})
                continue
            source_epoch, packer, real_tokens, _ = SourceSequences.progress(state)
            window = SourceSequences.parse_state(state).get("window")
            merged.append({
                "epoch": source_epoch,
                **slice_progress(packer, real_tokens),
                **({} if window is None else {"window": window}),
            })  # fmt: skip
        sources.append(merged)
    return {"world_size": world_size, "num_workers": num_workers, "sources": sources}


def check_mix_layout(elastic: object, num_sources: int, where: str) -> dict:
    """A merged mix layout: per source, every old slice's source epoch and progress."""
    keys = {"world_size", "num_workers", "sources"}
    if not isinstance(elastic, dict) or not keys <= set(elastic) <= keys | {"was"}:
        raise ResumeStateError(f"{where}: expected world_size, num_workers and sources")
    per_source = elastic["sources"]
    if not isinstance(per_source, list) or len(per_source) != num_sources:
        raise ResumeStateError(f"{where}: field 'sources' must have {num_sources} entries")
    for slices in per_source:
        check_layout({**elastic, "slices": slices}, where, per_slice=_check_source_slice)
    return elastic


def _check_source_slice(value: object, where: str) -> None:
    """One old slice of one source: its source epoch and that epoch's progress."""
    if not isinstance(value, dict) or not isinstance(value.get("epoch"), int):
        raise ResumeStateError(f"{where}: each old slice needs its source 'epoch'")
    if value["epoch"] < 0:
        raise ResumeStateError(f"{where}: a source epoch must be >= 0")
    check_progress({k: v for k, v in value.items() if k not in ("epoch", "window")}, where)


def remainder_packers(
    source: DatasetSource,
    options: StreamOptions,
    layout: dict,
    index: int,
    *,
    new_index: int,
    new_slices: int,
) -> tuple[Callable[[StreamOptions], Packer], int]:
    """A factory of this new slice's remainder packer for source `index` of the merged mix
    `layout` (packing with the options it is given), and the epoch after it."""
    per_slice = layout["sources"][index]
    world_size, num_workers = int(layout["world_size"]), int(layout["num_workers"])
    old = saved_options(options, layout)
    plans: dict[tuple, EpochPlan] = {}  # per (source epoch, window an old slice packed with)

    def plan(entry: dict) -> EpochPlan:
        window = entry.get("window") or {}
        key = (entry["epoch"], tuple(sorted(window.items())))
        if key not in plans:
            plans[key] = plan_for(
                source, with_window(old, window) if window else old, epoch=entry["epoch"],
                world_size=world_size, num_workers=num_workers,
            )  # fmt: skip
        return plans[key]

    progress = [{k: v for k, v in e.items() if k != "window"} for e in per_slice]
    residuals = [
        residual_tokens(plan(e), s, p) for s, (e, p) in enumerate(zip(per_slice, progress))
    ]
    segments = cut_ranges(residuals, new_slices)[new_index][2]

    def residual(s: int) -> Iterator[np.ndarray]:
        return residual_documents(source, options, plan(per_slice[s]), s, progress[s])

    def make(packing: StreamOptions) -> Packer:
        return packer_for(RemainderDocuments(residual, segments), packing, source.manifest.masked)

    return make, max(entry["epoch"] for entry in per_slice) + 1
