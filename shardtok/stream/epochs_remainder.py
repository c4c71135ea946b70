"""Elastic resume of one dataset streamed over several epochs (``EpochsStream``, ``num_batches``).

Every worker of a rank yields as many batches in each epoch, and the loader takes them
round-robin, so worker ``w`` of ``K`` yields the rank's steps ``T0 + j * K + w``. The old
workers' states give the rank step ``T = T0 + sum of their batches`` (the same on every rank)
and, per old slice, the epoch its state is in and the local batch that epoch began at. The
epoch ``p`` of step ``T`` is where the new layout continues: ``merge_epochs_states`` records
what the states say (it has no access to the data); ``remainder_of`` (which has) finds ``p``
with the old layout's plan of one epoch and keeps, per old slice, its progress in ``p``. A
slice whose state is still in an earlier epoch (it yielded that epoch's last batch; parts
switch lazily) has not started ``p``: its slice of ``p`` is untouched. The new stream then
finishes ``p`` by the single-dataset rule (``ElasticStream``) and goes on with epochs
``p + 1, ...`` in the new layout, its steps counted from ``T``.

The merged layout (a ``merged`` state's ``elastic``)::

    {"world_size", "num_workers", "slices": [{"packer", "real_tokens"}, ...],
     "step": T, "first_step": T0,
     "parts": [{"epoch": e, "begin": local batch e began at, "batches": local batches}, ...]}

Refused: ranks saved at different steps, workers off the round robin, and a state still in an
epoch that was itself resumed elastically (its remainder resumes only in its own layout).
"""

from __future__ import annotations

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.build import plan_for
from shardtok.stream.nodes.batcher import Batcher
from shardtok.stream.options import StreamOptions
from shardtok.stream.rank import worker_of
from shardtok.stream.remainder import check_layout, saved_options, slice_progress

_PLACEMENT = ("epoch", "rank", "world_size", "worker", "num_workers")
KIND = "epochs_stream"
FIELDS = {
    **{k: envelope.INT for k in _PLACEMENT},
    "first_step": envelope.INT,
    "batches": envelope.INT,
    "current": envelope.INT,
    "slice": envelope.OPTIONAL_STATE,
    "elastic": envelope.OPTIONAL_OBJECT,
    # The local batch the current epoch began at: earlier epochs' lengths depend on the batch
    # size they ran with. Absent in states of releases before 0.4 (the sum of their lengths).
    "begin": envelope.INT,
}
OPTIONAL = ("begin",)
# A part of a stream that was not resumed elastically: an epoch's slice (SliceStream's fields).
_SLICE_FIELDS = {**{k: envelope.INT for k in _PLACEMENT}, "batcher": envelope.STATE}
_WHERE = "merge_states"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def part_batches(slice_state: dict | None) -> int:
    """Batches a part's own state (``slice_stream`` or ``elastic_stream``) has yielded."""
    if slice_state is None:
        return 0
    key = "remainder" if slice_state.get("kind") == "elastic_stream" else "batcher"
    return int(Batcher.parse_state(slice_state.get(key))["batches"])


def merge_epochs_states(
    streams: list[dict | None], world_size: int, num_workers: int, epoch: int
) -> dict:
    """The merged layout of every old (rank, worker)'s ``epochs_stream`` state (slice order;
    None: a worker that never started), whose run began at epoch `epoch`."""
    parsed: list[dict | None] = [
        None if s is None else envelope.parse(s, KIND, FIELDS, OPTIONAL) for s in streams
    ]
    started = [s for s in parsed if s is not None]
    if len({s["first_step"] for s in started}) > 1:
        raise ResumeStateError(f"{_WHERE}: epochs stream states begun at different steps")
    if len({repr(s["elastic"]) for s in started}) > 1:
        raise ResumeStateError(f"{_WHERE}: epochs stream states of different elastic resumes")
    for one in started:
        in_remainder = one["batches"] == 0 or (one["slice"] or {}).get("kind") == "elastic_stream"
        if one["elastic"] is not None and in_remainder:
            raise ResumeStateError(
                f"{_WHERE}: rank {one['rank']} worker {one['worker']} is still in the remainder of "
                "an elastically resumed epoch; finish it with the same world size and workers "
                "(a batch into the next epoch is enough), then merge"
            )
    first_step = started[0]["first_step"] if started else 0
    parts: list[dict] = []
    slices: list[dict] = []
    for s in parsed:
        if s is None:
            parts.append({"epoch": epoch, "begin": 0, "batches": 0})
            slices.append(slice_progress(None, 0))
            continue
        done = part_batches(s["slice"])
        if done > s["batches"]:
            raise ResumeStateError(
                f"{_WHERE}: epochs stream state of rank {s['rank']} worker {s['worker']}: its "
                f"epoch holds {done} batches, more than the {s['batches']} it yielded"
            )
        parts.append({"epoch": s["current"], "begin": s["batches"] - done, "batches": s["batches"]})
        if s["slice"] is None:
            slices.append(slice_progress(None, 0))
        else:
            own = envelope.parse(s["slice"], "slice_stream", _SLICE_FIELDS)
            slices.append(slice_progress(*Batcher.progress(own["batcher"])))
    step = _rank_step(parts, world_size, num_workers, first_step)
    return {
        "world_size": world_size,
        "num_workers": num_workers,
        "slices": slices,
        "step": step,
        "first_step": first_step,
        "parts": parts,
    }


def _rank_step(parts: list[dict], world_size: int, num_workers: int, first_step: int) -> int:
    """The rank step every rank saved at, checking each rank's workers are where the round
    robin puts them: the first ``(T - T0) % K`` one batch ahead of the others."""
    steps = set()
    for rank in range(world_size):
        counts = [p["batches"] for p in parts[rank * num_workers : (rank + 1) * num_workers]]
        taken = sum(counts)
        local, ahead = divmod(taken, num_workers)
        if counts != [local + (w < ahead) for w in range(num_workers)]:
            raise ResumeStateError(
                f"{_WHERE}: the workers of rank {rank} yielded {counts} batches, not what a "
                "round robin over them gives"
            )
        steps.add(first_step + taken)
    if len(steps) != 1:
        raise ResumeStateError(
            f"{_WHERE}: ranks saved at different steps {sorted(steps)}; save every rank at the "
            "same step"
        )
    return steps.pop()


def is_epochs_layout(layout: dict) -> bool:
    return isinstance(layout, dict) and "parts" in layout


def check_epochs_layout(layout: object, where: str) -> dict:
    """A merged layout: the elastic one (``check_layout``), plus ``step``, ``first_step``
    and ``parts`` when it is an epochs stream's."""
    layout = check_layout(layout, where)
    if not is_epochs_layout(layout):
        return layout
    for key in ("step", "first_step"):
        if not _is_count(layout.get(key)):
            raise ResumeStateError(f"{where}: field {key!r} must be a non-negative integer")
    parts = layout["parts"]
    count = layout["world_size"] * layout["num_workers"]
    if not isinstance(parts, list) or len(parts) != count:
        raise ResumeStateError(f"{where}: field 'parts' must list all {count} old slices")
    for part in parts:
        if (
            not isinstance(part, dict)
            or set(part) != {"epoch", "begin", "batches"}
            or not all(_is_count(v) for v in part.values())
            or part["begin"] > part["batches"]
        ):
            raise ResumeStateError(
                f"{where}: each old slice's part must be {{'epoch', 'begin', 'batches'}}, "
                "non-negative integers with begin <= batches"
            )
    if layout["step"] < layout["first_step"]:
        raise ResumeStateError(f"{where}: field 'step' lies before 'first_step'")
    return layout


def remainder_of(
    source: DatasetSource, options: StreamOptions, layout: dict, epoch: int
) -> tuple[int, dict]:
    """The epoch an elastic resume continues in, and the old layout's positions in it (what
    ``ElasticStream`` finishes). A plain merged layout (of one epoch's states) is `epoch`'s."""
    if not is_epochs_layout(layout):
        return epoch, layout
    world_size, num_workers = layout["world_size"], layout["num_workers"]
    lengths: dict[int, int] = {}

    old = saved_options(options, layout)

    def length(e: int) -> int:  # an old worker's batches in epoch e (all workers: the same)
        if e not in lengths:
            plan = plan_for(source, old, epoch=e, world_size=world_size, num_workers=num_workers)
            lengths[e] = plan.batches_per_slice
        return lengths[e]

    worker, local = worker_of(layout["step"], layout["first_step"], num_workers)
    at = layout["parts"][worker]  # rank 0's worker that yields step T: its batch `local`
    p = at["epoch"] if local - at["begin"] < length(at["epoch"]) else at["epoch"] + 1
    slices = []
    for part, progress in zip(layout["parts"], layout["slices"], strict=True):
        if part["epoch"] == p:
            slices.append(progress)
        elif part["epoch"] < p and part["batches"] == part["begin"] + length(part["epoch"]):
            slices.append(slice_progress(None, 0))  # done with its epoch: p untouched
        else:
            raise ResumeStateError(
                f"elastic resume: an old worker is in epoch {part['epoch']} after "
                f"{part['batches']} batches, which does not fit step {layout['step']} in "
                f"epoch {p}"
            )
    return p, {"world_size": world_size, "num_workers": num_workers, "slices": slices}
