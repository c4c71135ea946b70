"""How many batches a ``ShardStreamDataset`` yields: what `num_batches` may be, each worker's
share of it, and the check that a DataLoader runs the worker count ``len()`` counted for.

Every worker of a rank yields as many batches (the loader takes them round-robin), so
`num_batches` per rank becomes ``ceil(num_batches / K)`` per worker: ``len()`` is a multiple of
the K it counted for, and another K gives another length.
"""

from __future__ import annotations

import warnings

from shardtok.errors import UsageError
from shardtok.stream.mix.spec import MixSpec
from shardtok.stream.mix.stages import Curriculum


def check_num_batches(dataset: object, num_batches: int | None) -> None:
    """Mixes and curriculum stages never end, so they need `num_batches` (batches per rank);
    one dataset may have it (it then runs on into further epochs)."""
    if isinstance(dataset, Curriculum) and len(dataset.stages) > 1:
        if num_batches is None or num_batches < 1:
            raise UsageError(
                "curriculum stages need num_batches (batches per rank) >= 1: the last stage "
                "never ends"
            )
    elif isinstance(dataset, (MixSpec, Curriculum)):
        if num_batches is None or num_batches < 1:
            raise UsageError("a mixed dataset needs num_batches (batches per rank) >= 1")
    elif num_batches is not None and num_batches < 1:
        raise UsageError("num_batches (batches per rank) must be >= 1")


def per_worker(num_batches: int, num_workers: int) -> int:
    """Each of `num_workers` workers' batches for `num_batches` per rank (0 workers count as 1)."""
    return -(-num_batches // max(num_workers, 1))


def check_worker_count(
    num_workers: int, *, hint: int | None, counted: int | None, first_worker: bool
) -> None:
    """In a DataLoader worker that runs with `num_workers`: refuse a count other than the
    constructor's `hint`, or (no hint) warn once, from the `first_worker`, when ``len()`` was
    used and `counted` for another."""
    expected = max(hint or 0, 1)
    if num_workers == expected:
        return
    if hint is not None:
        raise UsageError(
            f"ShardStreamDataset(num_workers={hint}) runs in a DataLoader with {num_workers} "
            f"workers: pass num_workers={num_workers} (len() counts for it)"
        )
    if counted is not None and first_worker:
        warnings.warn(
            f"len() of this ShardStreamDataset counted for {counted} worker(s), the DataLoader "
            f"runs {num_workers}: pass num_workers={num_workers} to ShardStreamDataset, or use "
            "shardtok.torch.ShardLoader (its len() is exact)",
            stacklevel=3,
        )
