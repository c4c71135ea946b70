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

from dataclasses import replace

from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.build import plan_for, resolved
from shardtok.stream.mix.schedule import MixSchedule
from shardtok.stream.mix.sequences import with_source_seed
from shardtok.stream.mix.spec import MixSpec
from shardtok.stream.mix.stages import Curriculum, Stage
from shardtok.stream.options import StreamOptions

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
    carried = [[0] * slots for _ in curriculum.sources]  # continuing sources: served so far
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
            seeded = with_source_seed(stage_options, i)
            walked = per_worker
            if curriculum.continues:  # one seed all run; it goes on from earlier stages
                seeded = with_source_seed(
                    resolved(curriculum.options_for(0, options), curriculum.sources), ids[i]
                )
                carried[ids[i]] = [a + b for a, b in zip(carried[ids[i]], per_worker)]
                walked = carried[ids[i]]
            walk = _walk_epochs(
                source, seeded, walked, world_size=world_size, slots=slots, epoch=epoch
            )
            rows.append(
                {
                    "id": ids[i],
                    "source": source.display,
                    "weight": stage.mix.shares[i],
                    "sequences_per_rank": per_rank,
                    "tokens_per_rank": per_rank * options.seq_len,
                    "sequences": per_rank * world_size,
                    "tokens": per_rank * world_size * options.seq_len,
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


def _walk_epochs(source, options, per_worker, *, world_size, slots, epoch) -> dict:
    """Every (rank, worker) slice of `source` serving `per_worker[w]` sequences from epoch
    `epoch` on: the epochs that implies (mean over slices, and the last one entered) and what
    is left unread of each slice's epoch in progress."""
    plans: dict[int, object] = {}

    def plan(e: int):
        if e not in plans:
            if len(plans) >= MAX_EPOCHS:
                # Epochs are planned one by one: a count that walks this many would take hours
                # (and a plan's memory each) for a preview of one small source's repeats.
                raise UsageError(
                    f"{source.display}: these batches read more than {MAX_EPOCHS:,} of its "
                    "epochs per slice, more than a preview walks: give fewer --max-batches"
                )
            plans[e] = plan_for(source, options, epoch=e, world_size=world_size, num_workers=slots)
        return plans[e]

    passes = 0.0
    last = epoch
    unread_sequences = unread_tokens = 0
    for rank in range(world_size):
        for w in range(slots):
            e, left = epoch, per_worker[w]
            while True:
                p = plan(e)
                s = p.slice_for(rank, w)  # type: ignore[attr-defined]
                if s.num_sequences == 0:
                    raise ShardtokError(
                        f"{source.display}: slice {s.index} of epoch {e} holds {s.num_tokens:,} "
                        f"tokens, too few for one {options.seq_len + 1}-token sequence; this "
                        "source is too small for this many ranks x workers"
                    )
                if left <= s.num_sequences:
                    break
                left -= s.num_sequences
                e += 1
            passes += e - epoch + left / s.num_sequences
            last = max(last, e)
            unread_sequences += s.num_sequences - left
            unread_tokens += s.num_tokens - _tokens_read(p, s, left)
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
            f"{span}, {stage['batches_per_rank']:,} batches per rank of {stage['batch_size']}, "
            f"{stage['packing']} packing"
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
