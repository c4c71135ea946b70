"""Worker processes of a conversion: the cores to use, the start method, the tokenizing pool.

The one-command convert and run-units tokenize in :func:`worker_pool`; the merge writes shards
in a plain pool of :func:`mp_context` (its tasks need no worker state).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

from shardtok.convert.worker import WorkerConfig, init_worker


def usable_cores() -> int:
    """Cores this process may use (a container's CPU set, not the host's core count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def mp_context(start_method: str | None):
    """fork where it is safe and cheap (Linux), spawn elsewhere (macOS, Windows)."""
    if start_method is not None:
        return multiprocessing.get_context(start_method)
    if sys.platform == "linux":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


@contextlib.contextmanager
def worker_pool(
    config: WorkerConfig, workers: int, start_method: str | None = None
) -> Iterator[ProcessPoolExecutor]:
    """`workers` processes ready to run worker.tokenize_unit. Start it before anything starts a
    thread here (tqdm's monitor), so forking is safe; fork also spares each worker re-importing
    and unpickling. Workers exit when this process dies, however it dies (see worker.py)."""
    context = mp_context(start_method)
    # This process only ever holds the write end; it is never written.
    alive_r, alive_w = context.Pipe(duplex=False)
    try:
        pool = ProcessPoolExecutor(
            workers, mp_context=context, initializer=init_worker,
            initargs=(config, alive_r, alive_w),
        )  # fmt: skip
        try:
            yield pool
        finally:
            retiring = getattr(pool, "_shardtok_retiring", None)
            if retiring is not None:
                retiring.join()
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        alive_r.close()
        alive_w.close()


def retire(pool: ProcessPoolExecutor) -> None:
    """Start shutting down `pool`, whose tasks are all done, on a thread of its own: its workers
    exit (~10 ms: a forked worker unmaps its parent's memory) while the caller writes the last
    shard; leaving :func:`worker_pool` waits for them."""
    if getattr(pool, "_shardtok_retiring", None) is None:
        thread = threading.Thread(target=pool.shutdown, name="shardtok-pool-shutdown", daemon=True)
        pool._shardtok_retiring = thread  # type: ignore[attr-defined]
        thread.start()
