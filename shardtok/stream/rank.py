"""One rank's batches come from its K workers in turn: the DataLoader's round robin.

Worker ``w`` yields the rank's 0-based steps ``first_step + j * K + w`` (``j``: its local batch;
``first_step``: 0, or the step an elastic resume began its layout at), and a worker with no
batch left is passed over. Everything that maps a rank's steps to its workers -- both loaders,
``shardtok stream``, a trace, a curriculum's stage boundaries, a merged state's step -- uses
this module, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtok.errors import ResumeStateError

PLACEMENT_KEYS = ("rank", "world_size", "worker", "num_workers")


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    worker: int
    num_workers: int

    @property
    def index(self) -> int:
        """The slice index: rank-major, as the epoch plan numbers slices."""
        return self.rank * self.num_workers + self.worker

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in PLACEMENT_KEYS}

    @classmethod
    def parse(cls, value: object, where: str) -> Placement:
        if not isinstance(value, dict) or set(value) != set(PLACEMENT_KEYS):
            raise ResumeStateError(f"{where}: field 'placement' must hold {PLACEMENT_KEYS}")
        for key in PLACEMENT_KEYS:
            v = value[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ResumeStateError(f"{where}: placement {key!r} must be >= 0, got {v!r}")
        p = cls(**value)
        if p.world_size < 1 or p.num_workers < 1 or p.rank >= p.world_size:
            raise ResumeStateError(f"{where}: placement {value} is not a valid layout")
        if p.worker >= p.num_workers:
            raise ResumeStateError(f"{where}: placement {value} is not a valid layout")
        return p


class RoundRobin:
    """Whose batch comes next among a rank's `count` workers, starting with `first`."""

    def __init__(self, count: int, first: int = 0):
        if count < 1:
            raise ValueError(f"a rank has at least one worker stream, got {count}")
        self.count = count
        self.next_worker = first % count
        self.active = [True] * count

    def take(self) -> int | None:
        """The worker whose batch is next (the turn moves on), or None when none has any."""
        for _ in range(self.count):
            worker = self.next_worker
            self.next_worker = (worker + 1) % self.count
            if self.active[worker]:
                return worker
        return None

    def done(self, worker: int) -> None:
        """`worker` has no batch left this epoch: its turns pass to the others."""
        self.active[worker] = False


def worker_of(step: int, first_step: int, count: int) -> tuple[int, int]:
    """(worker, its local batch) that yields the rank's 0-based `step`."""
    return (step - first_step) % count, (step - first_step) // count


def step_of(worker: int, local: int, first_step: int, count: int) -> int:
    """The rank's 0-based step that `worker`'s local batch `local` is."""
    return first_step + local * count + worker


def first_local(step: int, first_step: int, worker: int, count: int) -> int:
    """`worker`'s first local batch at or after the rank's 0-based `step`."""
    return max(0, -(-(step - first_step - worker) // count))
