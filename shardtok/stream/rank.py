"""One rank's batches come from its K workers in turn: the DataLoader's round robin.

Worker ``w`` yields the rank's 0-based steps ``first_step + j * K + w`` (``j``: its local batch;
``first_step``: 0, or the step an elastic resume began its layout at), and a worker with no
batch left is passed over. Everything that maps a rank's steps to its workers -- both loaders,
``shardtok stream``, a trace, a curriculum's stage boundaries, a merged state's step -- uses
this module, so they cannot disagree.
"""

from __future__ import annotations


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
