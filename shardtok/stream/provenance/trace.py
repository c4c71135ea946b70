"""Provenance: where every token of one training step's batch comes from.

``trace_step(setup, step=N, rank=R, ...)`` recomputes, from the plan and (optionally) a saved
state alone, which documents rank R's batch at step N holds: per sequence, the source, the
shard file, the document (its index in the shard, and in ``export-megatron``'s output), the
token range of that document and where in the ``seq_len + 1`` window it sits, and the padding.

How. Step N (1-based, one batch per rank) is rank step ``t = N - 1``. A rank's DataLoader
takes batches from its K workers round-robin and every worker yields equally many per part, so
worker ``w = (t - T0) % K`` yields it as its local batch ``j = (t - T0) // K`` (T0: 0, or the
step this layout's streams began at, as a saved state records it). The trace builds worker w's
stream exactly as training does, but over ``AddressSource``s (``StreamSetup.map_sources``),
whose documents are token addresses; ``stream.locate(j)`` names the part (epoch, stage) and the
batches before it there, the packer's rows are pulled past those, and the next ``batch_size``
rows are the batch, slot by slot, as addresses. A trace cannot disagree with the stream: it
runs the stream's own code.

Cost: the worker's rows before the step are replayed from its start (or its saved state), as
addresses: no ``.bin`` is read, only the idx of the shards passed (``skip``: concat windows,
also a mix's, are passed over in runs; greedy and bfd row by row). Measured on 2 cores, 8 x
2048 batches: 0.4-0.7 s per 10,000 local batches of a worker, whatever the packing (bfd ~30%
slower); step 10**6 of a 2-worker mix in 20 s.
"""

from __future__ import annotations

import numpy as np

from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.factory import StreamSetup
from shardtok.stream.nodes.base import Located
from shardtok.stream.provenance.addresses import AddressSource, split_addresses
from shardtok.stream.provenance.skip import skip_rows
from shardtok.stream.provenance.states import saved_rank
from shardtok.stream.rank import worker_of
from shardtok.stream.resume.rank_state import RankState
from shardtok.stream.resume.saved import Placement

# A bound far past any training run's steps, so a step or batch count is refused before a
# preview, a trace or a schedule is sized or walked by it (its rows stay within int64 too).
MAX_STEPS = 10**12
# Batches a trace replays on addresses from the start of the part that holds its step (~15 µs
# each): about a minute at the bound. Past it a state saved nearer the step is the way.
MAX_REPLAY = 4 * 10**6


def trace_step(
    setup: StreamSetup,
    *,
    step: int,
    rank: int,
    world_size: int,
    num_workers: int,
    epoch: int = 0,
    num_batches: int | None = None,
    state: object = None,
) -> dict:
    """Rank `rank`'s batch at 1-based training step `step`, sequence by sequence (plain data).

    `num_workers`: the rank's DataLoader workers (0: in process). `num_batches`: batches per
    rank, as given to ``ShardStreamDataset`` (a mix, or a dataset streamed past one epoch);
    without it a single dataset traces within epoch `epoch`. `state`: a saved position of this
    rank (the CLI's state file, a ``ShardLoader`` state, or one dataset worker state) to start
    from; steps at or before it are refused. See the module docstring for the rule and the
    output's fields."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise UsageError(f"training steps count from 1, got {step!r}")
    for what, value in (("step", step), ("num_batches", num_batches)):
        if value is not None and value > MAX_STEPS:
            raise UsageError(f"{what} {value:,} is more than shardtok counts steps to")
    slots = max(int(num_workers), 1)
    saved: RankState | None = None
    if state is not None:
        saved = saved_rank(state, setup)
        _check_layout(saved, rank=rank, world_size=world_size, slots=slots, epoch=epoch)
    t = step - 1
    per_worker = None if num_batches is None else -(-int(num_batches) // slots)
    _check_end(setup, t, step, epoch=epoch, world_size=world_size, slots=slots,
               per_worker=per_worker, rank=rank)  # fmt: skip
    start = 0 if saved is None else saved.first_step
    if saved is not None and t < saved.batches:
        raise UsageError(
            f"step {step} was taken before the state: it holds {saved.batches:,} steps of rank "
            f"{rank}; trace a step after {saved.batches:,}, or trace without the state"
        )
    if t < start:
        raise UsageError(
            f"step {step} lies before step {start + 1}, where the state's layout began"
        )
    worker, local = worker_of(t, start, slots)
    addresses = setup.map_sources(AddressSource)
    stream = addresses.stream(
        Placement(rank, world_size, worker, slots),
        epoch=epoch,
        resume=None if saved is None else saved.workers[worker],
        num_batches=per_worker,
    )
    try:
        located = stream.locate(local)
    except ValueError as exc:
        raise UsageError(f"step {step} (worker {worker}'s batch {local}): {exc}") from None
    if located.skip > MAX_REPLAY:
        raise UsageError(
            f"step {step} lies {located.skip:,} batches into worker {worker}'s stream of its "
            f"part, more than a trace replays ({MAX_REPLAY:,}): trace from a state saved nearer "
            "the step (--state; a state saved with each checkpoint makes any later step quick)"
        )
    # a stage's own batch size and sequence length
    batch_size = located.stream.batcher.batch_size  # type: ignore[attr-defined]
    seq_len = located.stream.batcher.upstream.window - 1  # type: ignore[attr-defined]
    rows = _batch_rows(located, batch_size, step)
    table = source_table(addresses)
    return {
        "step": step,
        "rank": rank,
        "world_size": world_size,
        "num_workers": int(num_workers),
        "worker": worker,
        "local_batch": local,
        "epoch": epoch,
        "part": dict(located.part),
        "state_steps": None if saved is None else saved.batches,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "packing": setup.options.packing,
        "pad_id": setup.options.pad_id,
        "sources": [{"id": i, "location": s.display} for i, s in enumerate(table)],
        "sequences": [
            {"row": b, **describe_row(row, starts, length, table[source], source)}
            for b, (row, starts, length, source) in enumerate(rows)
        ],
    }


def source_table(setup: StreamSetup) -> list:
    """The sources rows name by id (``row_source``): a curriculum's table, else the setup's."""
    if setup.curriculum is not None:
        return setup.curriculum.sources
    return list(setup.sources)


def _check_layout(saved: RankState, *, rank: int, world_size: int, slots: int, epoch: int) -> None:
    ours = (saved.rank, saved.world_size, len(saved.workers), saved.epoch)
    if ours != (rank, world_size, slots, epoch):
        raise UsageError(
            f"the state is rank {saved.rank} of world size {saved.world_size} with "
            f"{len(saved.workers)} worker stream(s) in epoch {saved.epoch}; the trace asked for "
            f"rank {rank} of {world_size} with {slots} in epoch {epoch}: trace with the state's "
            "layout"
        )


def _check_end(setup, t, step, *, epoch, world_size, slots, per_worker, rank) -> None:
    if per_worker is not None:
        limit = per_worker * slots
        if t >= limit:
            raise UsageError(
                f"step {step} is past the end of the run: num_batches (--max-batches) gives "
                f"{limit:,} steps per rank ({per_worker:,} per worker x {slots})"
            )
    elif setup.mix is None and setup.curriculum is None:
        plan = setup.plan(epoch=epoch, world_size=world_size, num_workers=slots)
        if t >= plan.batches_per_rank:
            raise UsageError(
                f"step {step} is past the end of epoch {epoch}: rank {rank} has "
                f"{plan.batches_per_rank:,} steps per epoch with {slots} worker(s); trace a "
                "later epoch, or give num_batches (--max-batches) to run on into further epochs"
            )


def _batch_rows(located: Located, batch_size: int, step: int) -> list:
    """The batch's rows as (addresses, starts, length, source id), after the skipped ones."""
    batcher = located.stream.batcher
    limit = getattr(batcher, "num_batches", None)
    if limit is not None and batcher.batches + located.skip >= limit:  # type: ignore[attr-defined]
        raise UsageError(
            f"step {step} is past the end of its stream part {located.part or ''}: "
            f"{limit:,} batches per worker"
        )
    packer = batcher.upstream  # type: ignore[attr-defined]
    window = packer.window
    try:
        skip_rows(packer, located.skip * batch_size)
        rows = []
        for _ in range(batch_size):
            row = np.empty(window, dtype=np.int64)
            starts, length = packer.next_into(row)
            rows.append((row, list(starts), int(length), int(packer.row_source)))
    except StopIteration:
        raise ShardtokError(
            f"step {step}: the stream ran out of data before this batch (do the shards hold "
            "the token counts the manifest says?)"
        ) from None
    return rows


def describe_row(
    row: np.ndarray, starts: list[int], length: int, source: AddressSource, source_id: int
) -> dict:
    """One packed row of addresses as its segments: runs of consecutive tokens of one document,
    cut where the packer started a piece, where addresses jump, and at document ends."""
    window = len(row)
    addresses = row[:length]
    shards, offsets = split_addresses(addresses)
    documents = np.zeros(length, dtype=np.int64)
    manifest = source.manifest
    for shard in np.unique(shards).tolist():
        here = shards == shard
        bounds = source.offsets(manifest.shards[shard].file)
        documents[here] = np.searchsorted(bounds, offsets[here], side="right") - 1
    cuts = np.zeros(length, dtype=bool)
    cuts[[s for s in starts if 0 <= s < length]] = True
    if length:
        cuts[0] = True
        cuts[1:] |= (np.diff(addresses) != 1) | (np.diff(documents) != 0)
    edges = [*np.flatnonzero(cuts).tolist(), length]
    # Shards and documents are numbered in the whole dataset (index.json, export-megatron's
    # order), also when the source streams a subset of its shards.
    positions = source.subset_positions or range(len(manifest.shards))
    firsts = _first_documents(source.dataset_manifest)
    segments = []
    for a, b in zip(edges, edges[1:]):
        shard, document = int(shards[a]), int(documents[a])
        bounds = source.offsets(manifest.shards[shard].file)
        begin = int(offsets[a]) - int(bounds[document])
        segments.append(
            {
                "source": source_id,
                "location": source.display,
                "shard": manifest.shards[shard].file,
                "shard_index": positions[shard],
                "document": document,
                "dataset_document": firsts[positions[shard]] + document,
                "tokens": [begin, begin + b - a],
                "document_length": int(bounds[document + 1] - bounds[document]),
                "positions": [a, b],
            }
        )
    return {
        "source": source_id,
        "length": length,
        "segments": segments,
        "padding": [length, window] if length < window else None,
    }


def _first_documents(manifest) -> list[int]:
    """Per shard, the index its first document has in the whole dataset (manifest order, the
    order ``export-megatron`` writes)."""
    counts = [entry.num_documents for entry in manifest.shards]
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
