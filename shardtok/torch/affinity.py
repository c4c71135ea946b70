"""Pinning loader workers to CPUs of their own.

Why: on a small machine a worker that the scheduler moves between cores arrives at a cold
cache each time. Measured on the 2-core benchmark VM (ShardLoader, 2 workers, zstd shards):
~55-64 M tokens/s unpinned, ~80 M tokens/s with each worker on its own core, where every batch
cost the workers ~25% less CPU (benchmarks/RESULTS.md).

Which CPUs: the process's allowed CPUs (``os.sched_getaffinity``). When a launcher has not
narrowed them already and several ranks share the node (torchrun's ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE``), each local rank takes an equal, disjoint share, so the workers of two
ranks never land on the same CPU. Worker ``w`` takes CPU ``w`` of that share (wrapping around
when there are more workers than CPUs).
"""

from __future__ import annotations

import os


def worker_cpus() -> list[int]:
    """The CPUs this rank's loader workers may be pinned to, in order."""
    allowed = sorted(os.sched_getaffinity(0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if local_world > 1 and len(allowed) == os.cpu_count():  # nobody split the node: split it
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        share = allowed[
            local_rank * len(allowed) // local_world : (local_rank + 1)
            * len(allowed)
            // local_world
        ]
        allowed = share or allowed
    return allowed


def pin_worker(worker: int, cpus: list[int] | None = None) -> int:
    """Pin the calling process (loader worker `worker`) to one CPU; returns that CPU.

    Also usable as a plain DataLoader's ``worker_init_fn``."""
    cpus = cpus or worker_cpus()
    cpu = cpus[worker % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


__all__ = ["pin_worker", "worker_cpus"]
