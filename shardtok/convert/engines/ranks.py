"""The run-units phase: a rank's share of a planned job's units, tokenized in local processes.

``run_units(output, rank, world_size)`` tokenizes the units i ≡ rank (mod world_size) that are
not done yet, on as many machines and as often as the scheduler likes (a Slurm array, a job per
rank): a unit's files are deterministic and its marker is written last, so a rerun, a requeued
task or two copies of one rank at once only ever write the same bytes, and nothing is swept under
a live writer. The plan and merge phases are phases.py's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass

from shardtok._process import usable_cores
from shardtok.convert.engines.pool import worker_pool
from shardtok.convert.job.output_dir import output_folder
from shardtok.convert.job.output_lock import os_error
from shardtok.convert.job.phases import worker_config
from shardtok.convert.job.plan_file import load_plan
from shardtok.convert.job.progress import ConvertProgress
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.unit_status import describe_failure, pending_units
from shardtok.convert.job.workdir import WorkDir
from shardtok.errors import UsageError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    """What one run-units call did. `failed`: its units that stop the conversion (their
    failure is recorded; status and merge name the first one in input order)."""

    output: str
    rank: int
    world_size: int
    units: int  # this rank's units
    already_done: int
    tokenized: int
    failed: tuple[int, ...] = ()
    seconds: float = 0.0
    # The failure that stops the conversion, when it holds up this rank (one of its units
    # failed, or its later units were left undone)
    failure: str | None = None
    after_failure: int = 0  # units left undone: the conversion stops before them

    def summary(self) -> str:
        line = (
            f"rank {self.rank} of {self.world_size}: {self.units:,} work units, "
            f"{self.already_done:,} already done, {self.tokenized:,} tokenized in "
            f"{self.seconds:.1f} s"
        )
        if self.failed:
            line += f", {len(self.failed):,} stopped the conversion"
        if self.after_failure:
            line += f", {self.after_failure:,} after a failure left undone"
        return line


def _check_rank(rank: int, world_size: int) -> None:
    for name, value in (("rank", rank), ("world size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"the {name} must be an integer, got {value!r}")
    if world_size < 1:
        raise UsageError(f"the world size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside a world of {world_size} (0..{world_size - 1})")


def run_units(
    output: str,
    rank: int,
    world_size: int,
    *,
    workers: int = 1,
    storage_options: dict | None = None,
    progress: bool = True,
    start_method: str | None = None,
) -> RunSummary:
    """Tokenize the units i ≡ `rank` (mod `world_size`) of the plan in `output` that are not
    done, in `workers` local processes (0: every core). Idempotent; two copies of one rank may
    run at once. A unit whose failure stops the conversion is recorded, and not retried."""
    started = time.monotonic()
    _check_rank(rank, world_size)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UsageError(f"workers must be a count (0: every core), got {workers!r}")
    folder = output_folder(output, storage_options)
    workdir = WorkDir(folder)
    try:
        plan = load_plan(workdir)
        mine = range(rank, len(plan.units), world_size)
        pending = pending_units(plan, workdir, mine)
        failed = list(pending.stopped)
        tokenized = 0
        workers = max(1, min(workers or usable_cores(), len(pending.todo) or 1))
        with contextlib.ExitStack() as stack:
            futures = {}
            if pending.todo:
                config = worker_config(plan, output, storage_options)
                pool = stack.enter_context(worker_pool(config, workers, start_method))
                # In index order: a rank's earliest failure is found first.
                futures = {pool.submit(u): u.index for u in pending.todo}
            logger.info(
                "rank %d of %d: %d work units, %d done before, %d to tokenize in %d process(es)",
                rank, world_size, len(mine), len(pending.kept), len(pending.todo), workers,
            )  # fmt: skip
            bar = ConvertProgress(sum(plan.units[i].nbytes for i in mine), progress)
            stack.callback(bar.close)
            for warning in pending.warnings:
                bar.note(warning)
            for result in pending.kept:
                bar.unit_done(result.input_bytes, result.num_documents, result.num_tokens, True)
            while futures:
                finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = futures.pop(future)
                    outcome = future.result()  # an error (a damaged input) stops the rank
                    if isinstance(outcome, UnitResult):
                        tokenized += 1
                        bar.unit_done(
                            outcome.input_bytes, outcome.num_documents, outcome.num_tokens, False
                        )
                        continue
                    failed.append(index)
                    # The conversion stops at this unit: this rank's later units are wasted work
                    # (earlier ones still matter: they give the failure its exact line).
                    for other in [f for f, i in futures.items() if i > index]:
                        if other.cancel():
                            del futures[other]
        failed.sort()
        known = failed + ([pending.stops_at] if pending.stops_at is not None else [])
        stops_at = min(known, default=None)
        undone = len(mine) - len(pending.kept) - tokenized - len(failed)
        failure = None
        if stops_at is not None and (failed or undone):  # this rank is held up by it
            failure = describe_failure(plan, workdir, stops_at)
        return RunSummary(
            folder.display, rank, world_size, len(mine), len(pending.kept), tokenized,
            tuple(failed), time.monotonic() - started, failure, undone,
        )  # fmt: skip
    except OSError as exc:
        raise os_error(exc, folder.display) from exc
