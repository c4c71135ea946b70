"""Elastic resume of a weighted mix: every source finishes its current epochs in the new layout.

Each old (rank, worker) is, for every source, somewhere in its own current source epoch (workers
move through a source's epochs independently). For each source, the residual streams of all old
slices (each in its own epoch; the rule of ``elastic.py``) are joined in old-slice order and cut
into the new ``world_size * num_workers`` slices; a new worker packs its share of every source's
remainder first and then continues that source with epoch ``max(old epochs) + 1`` in the new
layout. The mixing schedule restarts at step 0 in every new worker, so the weights hold from the
resume on. No document of an old slice's current epoch is repeated or skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.index.slices import cut_ranges
from shardtok.storage.dataset import DatasetSource
from shardtok.stream.build import packer_for, plan_for
from shardtok.stream.nodes.sequence import Packer
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.elastic import RemainderDocuments, residual_documents, residual_tokens


def merge_mixed_states(
    states: list[dict], indices: list[int], world_size: int, num_workers: int, epoch: int
) -> dict:
    """Per source and old slice: the source epoch and a batcher-like state of that epoch."""
    count = world_size * num_workers
    sources: list[list[dict | None]] | None = None
    for state, index in zip(states, indices, strict=True):
        stream = state.get("stream")
        if stream is None:
            continue
        if "elastic" in stream:
            raise ResumeStateError(
                "merge_states: this mixed stream was itself resumed elastically; resume it "
                "with the same world size and workers"
            )
        per_source = stream["batcher"]["upstream"]["sources"]
        if sources is None:
            sources = [[None] * count for _ in per_source]
        for i, source_state in enumerate(per_source):
            sources[i][index] = {
                "epoch": int(source_state["epoch"]),
                "state": {
                    "upstream": source_state["packer"],
                    "real_tokens": int(source_state["epoch_real_tokens"]),
                },
            }
    if sources is None:
        raise ResumeStateError("merge_states: no worker of this mix had started")
    for per_slice in sources:  # workers that never started: their first epoch, untouched
        for index in range(count):
            if per_slice[index] is None:
                per_slice[index] = {"epoch": epoch, "state": None}
    return {"world_size": world_size, "num_workers": num_workers, "sources": sources}


def remainder_packers(
    source: DatasetSource,
    options: StreamOptions,
    per_slice: list[dict],
    *,
    world_size: int,
    num_workers: int,
    new_index: int,
    new_slices: int,
) -> tuple[Callable[[], Packer], int]:
    """A factory of this new slice's remainder packer for one source, and the epoch after it."""
    plans = {}
    for entry in per_slice:
        e = entry["epoch"]
        if e not in plans:
            plans[e] = plan_for(
                source, options, epoch=e, world_size=world_size, num_workers=num_workers
            )
    residuals = [
        residual_tokens(plans[entry["epoch"]], s, entry["state"])
        for s, entry in enumerate(per_slice)
    ]
    segments = cut_ranges(residuals, new_slices)[new_index][2]

    def residual(s: int) -> Iterator[np.ndarray]:
        entry = per_slice[s]
        return residual_documents(source, options, plans[entry["epoch"]], s, entry["state"])

    def make() -> Packer:
        return packer_for(RemainderDocuments(residual, segments), options)

    return make, max(entry["epoch"] for entry in per_slice) + 1
