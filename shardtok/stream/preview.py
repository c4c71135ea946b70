"""What the first N batches of a mix (or of curriculum stages) will read, before reading any.

Per stage and per source: the weight, the exact sequences and tokens the source serves over the
first N batches of every rank, how many of the source's epochs that implies, and what is left
unread of the epoch each (rank, worker) slice is in by then. Computed from the manifests and the
mixing schedule alone, with the rules the stream runs:

* rank step ``t`` is worker ``t % K``'s local batch ``t // K`` (the loader's round robin), so
  worker w serves ``ceil((N - w) / K)`` of the first N steps, and stage k's share of them is
  bounded by ``Curriculum.local_begins``;
* every stage's schedule starts at step 0 in every worker, so a stage's counts are
  ``MixSchedule.counts`` of its sequences (of its own batch size) in each worker, the same on
  every rank. With ``stage_switch: continue`` a source goes on from where the earlier stages
  left it (its epochs and unread parts count everything it served so far); with ``restart``
  every stage's sources start at their first epoch;
* a source's (rank, worker) slice serves its epoch plan's ``num_sequences``, then moves to the
  next epoch. Concat counts are exact; greedy and bfd plans give a lower bound on a slice's
  sequences (padding makes more), so their epochs are an upper bound there (``exact`` False).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.build import plan_for, resolved
from shardtok.stream.mix.schedule import MixSchedule
from shardtok.stream.mix.source import with_source_seed
from shardtok.stream.mix.spec import MixSpec
from shardtok.stream.mix.stages import Curriculum, Stage
from shardtok.stream.mix.window import same_window
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import sequence_count

MAX_EPOCHS = 10_000


def one_stage(spec: MixSpec, name: str = "mix") -> Curriculum:
    """A plain mix as a curriculum of one stage (its options go with it)."""
    return Curriculum([Stage(name, 1, spec)], dict(spec.options))


def mix_preview(
    curriculum: Curriculum | MixSpec,
    options: StreamOptions,
    *,
    max_batches: int,
    world_size: int = 1,
    num_workers: int = 0,
    epoch: int = 0,
) -> dict:
    """The preview of the first `max_batches` batches per rank (module docstring), plain data."""
    if isinstance(curriculum, MixSpec):
        curriculum = one_stage(curriculum)
    if max_batches < 1 or world_size < 1 or num_workers < 0:
        raise UsageError("max_batches and world_size must be positive, num_workers >= 0")
    slots = max(num_workers, 1)
    served = [-(-(max_batches - w) // slots) for w in range(slots)]  # local batches per worker
    begins = [curriculum.local_begins(0, w, slots) for w in range(slots)]
    stages = []
    # Continuing sources: every (rank, worker) slice's position, carried across stages.
    carried: dict[int, list[_SlicePosition]] = {}
    for k, stage in enumerate(curriculum.stages):
        stage_options = resolved(curriculum.options_for(k, options), stage.mix.sources)
        size = stage_options.batch_size
        local = [
            max(0, min(_end(begins[w], k), served[w]) - min(begins[w][k], served[w]))
            for w in range(slots)
        ]
        schedule = MixSchedule(stage.mix.weights)
        counts = [schedule.counts(n * size) for n in local]  # per worker, source
        ids = curriculum.source_ids(k)
        rows = []
        for i, source in enumerate(stage.mix.sources):
            per_worker = [c[i] for c in counts]
            per_rank = sum(per_worker)
            # continuing sources keep one seed all run (their number in the table)
            seeded = with_source_seed(stage_options, ids[i] if curriculum.continues else i)
            fresh = [_SlicePosition(epoch, epoch) for _ in range(world_size * slots)]
            positions = carried.setdefault(ids[i], fresh) if curriculum.continues else fresh
            walk = _walk_epochs(
                source, seeded, per_worker, positions, world_size=world_size, slots=slots,
                entered=[n > 0 for n in local],
            )  # fmt: skip
            rows.append(
                {
                    "id": ids[i],
                    "source": source.display,
                    "weight": stage.mix.shares[i],
                    "sequences_per_rank": per_rank,
                    "tokens_per_rank": per_rank * stage_options.seq_len,
                    "sequences": per_rank * world_size,
                    "tokens": per_rank * world_size * stage_options.seq_len,
                    **walk,
                }
            )
        batches = sum(local)
        first = stage.start_step
        rows_steps = None
        if first <= max_batches:
            last = min(max_batches, _next_start(curriculum, k) - 1)
            rows_steps = [first, last]
        stages.append(
            {
                "stage": k,
                "name": stage.name,
                "start_step": stage.start_step,
                "steps": rows_steps,
                "batches_per_rank": batches,
                "batch_size": size,
                "seq_len": stage_options.seq_len,
                "packing": stage_options.packing,
                "sources": rows,
            }
        )
    return {
        "stage_switch": curriculum.stage_switch,
        "notes": [] if curriculum.continues else _reread_notes(curriculum, options, stages),
        "batches_per_rank": max_batches,
        "world_size": world_size,
        "num_workers": num_workers,
        "batch_size": options.batch_size,
        "seq_len": options.seq_len,
        "epoch": epoch,
        "exact": all(s["packing"] == "concat" for s in stages),
        "stages": stages,
    }


def _reread_notes(curriculum: Curriculum, options: StreamOptions, stages: list[dict]) -> list:
    """A source served again by a later stage restarts there (every stage is a fresh mix):
    documents an earlier stage read can come again, in the same order when the source's own
    seed (the stage seed and its place in the mix) is the same."""
    notes = []
    seen: dict[object, tuple[int, int]] = {}  # source key -> (stage, its source seed)
    for k, stage in enumerate(curriculum.stages):
        seed = curriculum.options_for(k, options).seed
        for i, (source, row) in enumerate(zip(stage.mix.sources, stages[k]["sources"])):
            if not row["sequences"]:
                continue
            own = with_source_seed(replace(options, seed=seed), i).seed
            if source.key in seen:
                j, earlier = seen[source.key]
                order = (
                    "in the same order (the same seed and place in the mix): give the stage "
                    "its own seed to draw another"
                    if own == earlier
                    else "in another order"
                )
                notes.append(
                    f"stage {k} {stage.name!r} starts {source.display} from its beginning "
                    f"again, as every stage starts its sources: documents stage {j} "
                    f"{curriculum.stages[j].name!r} read come again, {order}"
                )
            seen[source.key] = (k, own)
    return notes


def _end(begins: list[int], k: int) -> float:
    return begins[k + 1] if k + 1 < len(begins) else float("inf")


def _next_start(curriculum: Curriculum, k: int) -> float:
    stages = curriculum.stages
    return stages[k + 1].start_step if k + 1 < len(stages) else float("inf")


@dataclass
class _SlicePosition:
    """Where one (rank, worker) slice of a source is: its epoch, the window it packs with and,
    once it read from the epoch, the part of it in progress (``_walk_epochs``)."""

    start: int  # the epoch the preview starts in
    epoch: int = 0
    options: StreamOptions | None = None  # None: the epoch not begun
    slice_tokens: int = 0  # of the slice of the epoch in progress
    tokens: int = 0  # of the part in progress: the slice's tokens, or a repacked rest's
    sequences: int = 0  # the part's sequences
    served: int = 0  # of them served
    read: int = 0  # tokens of the part read by the served ones
    repacked: bool = False  # the part is an epoch's rest packed with another window


def _walk_epochs(source, options, per_worker, positions, *, world_size, slots, entered) -> dict:
    """Every (rank, worker) slice of `source` serving `per_worker[w]` more sequences with
    `options` from its position (``positions[rank * slots + w]``, updated): the epochs read
    so far (mean over slices, from the preview's first epoch, and the last one entered)
    and what is left unread of each slice's part in progress. A slice that packed with another
    window first packs the rest of its part with this one (``SourceSequences``), if the
    worker has a batch in the stage (`entered[w]`: a stream enters a stage at its first batch)."""
    plans: dict[tuple, object] = {}

    def plan(e: int):
        key = (e, options.seq_len, options.stride)
        if key not in plans:
            if len(plans) >= MAX_EPOCHS:
                # Epochs are planned one by one: a count that walks this many would take hours
                # (and a plan's memory each) for a preview of one small source's repeats.
                raise UsageError(
                    f"{source.display}: these batches read more than {MAX_EPOCHS:,} of its "
                    "epochs per slice, more than a preview walks: give fewer --max-batches"
                )
            plans[key] = plan_for(source, options, epoch=e, world_size=world_size,
                                  num_workers=slots)  # fmt: skip
        return plans[key]

    stride = options.stride or options.seq_len + 1
    passes = 0.0
    last = min(at.start for at in positions)
    unread_sequences = unread_tokens = 0
    for rank in range(world_size):
        for w in range(slots):
            at = positions[rank * slots + w]

            def begin(epoch: int, at=at, rank=rank, w=w) -> None:
                s = plan(epoch).slice_for(rank, w)  # type: ignore[attr-defined]
                if s.num_sequences == 0:
                    raise ShardtokError(
                        f"{source.display}: slice {s.index} of epoch {epoch} holds "
                        f"{s.num_tokens:,} tokens, too few for one {options.seq_len + 1}-token "
                        "sequence; this source is too small for this many ranks x workers"
                    )
                at.epoch, at.slice_tokens, at.repacked = epoch, s.num_tokens, False
                at.tokens, at.sequences, at.served, at.read = s.num_tokens, s.num_sequences, 0, 0

            if at.options is None:
                begin(at.epoch)
            elif not entered[w]:
                pass  # a worker with no batch in this stage never switches to its window
            elif not same_window(at.options, options):  # the rest, packed with this window
                # the residual rule: concat from the next window on, greedy and bfd what their
                # rows did not take
                concat = plan(at.epoch).packing == "concat"
                taken = at.served * (at.options.stride or at.options.seq_len + 1)
                rest = max(0, at.tokens - (taken if concat else at.read))
                at.tokens, at.read, at.served, at.repacked = rest, 0, 0, True
                at.sequences = sequence_count(rest, plan(at.epoch).packing, options.seq_len, stride)
            if entered[w]:
                at.options = options
            left = per_worker[w]
            while left > at.sequences - at.served:
                left -= at.sequences - at.served
                begin(at.epoch + 1)
            at.served += left
            p = plan(at.epoch)
            at.read = (
                min(at.tokens, at.served * stride)
                if at.repacked
                else _tokens_read(p, p.slice_for(rank, w), at.served)  # type: ignore[attr-defined]
            )
            done = (
                1 - (at.tokens - at.read) / at.slice_tokens
                if at.repacked
                else at.served / at.sequences
            )
            passes += at.epoch - at.start + done
            last = max(last, at.epoch)
            unread_sequences += at.sequences - at.served
            unread_tokens += at.tokens - at.read
    return {
        "epochs": passes / (world_size * slots),
        "last_epoch": last,
        "unread_sequences": unread_sequences,
        "unread_tokens": unread_tokens,
    }


def _tokens_read(plan, piece, sequences: int) -> int:
    """Tokens of slice `piece` that its first `sequences` sequences read (as
    ``EpochPlan.tokens_read``: concat exact, greedy and bfd at most)."""
    if sequences == 0:
        return 0
    window = plan.seq_len + 1
    if plan.packing == "concat":
        return (sequences - 1) * plan.stride + window
    return min(piece.kept_tokens, sequences * window)


def format_preview(preview: dict) -> str:
    """The preview as a table per stage."""
    n, slots = preview["batches_per_rank"], max(preview["num_workers"], 1)
    lines = [
        f"mix preview: the first {n:,} batches per rank (steps 1..{n:,}) of "
        f"{preview['world_size']} rank(s) x {slots} worker(s); batches of "
        f"{preview['batch_size']} x {preview['seq_len']:,} input tokens"
    ]
    if n % slots:
        lines.append(
            f"  (a ShardStreamDataset with num_batches={n} yields {-(-n // slots) * slots:,} per "
            f"rank: a multiple of the {slots} workers)"
        )
    header = ("source", "weight", "sequences/rank", "tokens/rank", "tokens (job)", "epochs",
              "unread of the epoch in progress (job)")  # fmt: skip
    for stage in preview["stages"]:
        steps = stage["steps"]
        span = "not reached" if steps is None else f"steps {steps[0]:,}..{steps[1]:,}"
        lines.append(
            f"stage {stage['stage']} {stage['name']!r} (from step {stage['start_step']:,}): "
            f"{span}, {stage['batches_per_rank']:,} batches per rank of {stage['batch_size']} x "
            f"{stage.get('seq_len', preview['seq_len']):,}, {stage['packing']} packing"
        )
        table = [header]
        for row in stage["sources"]:
            table.append(
                (
                    f"{row['id']}: {row['source']}",
                    f"{100 * row['weight']:.2f}%",
                    f"{row['sequences_per_rank']:,}",
                    f"{row['tokens_per_rank']:,}",
                    f"{row['tokens']:,}",
                    f"{row['epochs']:.3f} (to epoch {row['last_epoch']})",
                    f"{row['unread_sequences']:,} sequences, {row['unread_tokens']:,} tokens",
                )
            )
        widths = [max(len(r[c]) for r in table) for c in range(len(header))]
        for r in table:
            cells = [r[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(r[1:-1], widths[1:-1])]
            lines.append("  " + "  ".join([*cells, r[-1]]))
    if len(preview["stages"]) > 1:
        lines.append(
            "at a stage switch every source continues from where it was (stage_switch: "
            "continue): epochs and unread parts count all it served so far"
            if preview["stage_switch"] == "continue"
            else "at a stage switch every stage starts its sources from their beginning "
            "(stage_switch: restart)"
        )
    lines += [f"note: {note}" for note in preview.get("notes", [])]
    if not preview["exact"]:
        lines.append(
            "greedy/bfd: a slice's sequences per epoch are a lower bound (padding makes more), "
            "so the epochs are at most and the unread parts at least these"
        )
    return "\n".join(lines)
