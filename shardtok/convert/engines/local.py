"""The conversion job: plan units, tokenize them in a process pool, assemble shards in order.

Workers tokenize units in any order and persist each one in the work folder, together with its
documents cut into frames and compressed (a frame never spans two units, so a worker can do this
alone). The main process assembles: as soon as unit k and every unit before it are finished, it hands
them to the merge's ShardAssembly and writes every shard they complete, while the workers keep
tokenizing later units. Compression thus scales with the workers instead of competing with them
for a core, and the shards are written by the same tasks as `shardtok convert merge` writes them.

Because units reach the writer in input order whatever finished first, the shards are
byte-identical for any worker count and any restart; the unit size moves frame boundaries, never
documents or tokens. After a kill, finished units are reused and the shards are simply written
again from unit 0: shard boundaries are only known by replaying the units, and appending frames
costs little (see docs/CONVERT.md), so rewriting is cheaper and safer than trusting
half-finished output.

The planning (inputs, checks, unit size, the plan file, the state of the output folder) is
planning.py's, shared with `shardtok convert plan` and the dask engine; the shards are written by
the merge's ShardAssembly and tasks, as `shardtok convert merge` writes them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

from shardtok._process import usable_cores
from shardtok._threads import beside
from shardtok.convert.engines.pool import worker_pool
from shardtok.convert.engines.unit_feed import UnitFeed
from shardtok.convert.job.failures import EncoderMismatch, UnitFailure
from shardtok.convert.job.merge import ShardAssembly
from shardtok.convert.job.merge_tasks import reframed_table, write_shard
from shardtok.convert.job.planning import (
    Planned,
    finished_result,
    open_job,
    plan_job,
    write_tokenizer_file,
)
from shardtok.convert.job.progress import ConvertProgress, ConvertResult
from shardtok.convert.job.spec import (
    ConvertJob,
    RunOptions,
    WorkerConfig,
)
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.unit_status import reusable_unit
from shardtok.convert.tokenizing.canary import UnitCanary
from shardtok.storage.folder import Folder

logger = logging.getLogger(__name__)


def convert(job: ConvertJob, run: RunOptions | None = None) -> ConvertResult:
    """Run (or resume, or recognise as done) the conversion `job`, as `run` says (default:
    every core, a progress bar).

    One conversion at a time per output folder (OutputInUseError for the second); an OS error
    (disk full, permissions) is an OutputIOError naming the path.
    """
    run = run or RunOptions()
    started = time.monotonic()
    with open_job(job, run) as (job, files):
        planned = plan_job(job, files, run, tokenizer_file=False)
        if planned.done is not None:
            return finished_result(job.output, planned.done)
        return _convert(planned, run, started)


def _convert(planned: Planned, run: RunOptions, started: float) -> ConvertResult:
    job, files, units, workdir = planned.job, planned.files, planned.units, planned.workdir
    out = Path(job.output)
    dtype = job.tokenizer.dtype
    ready: dict[int, UnitResult | UnitFailure | EncoderMismatch | Exception] = {}
    for unit in units:
        previous, warning = reusable_unit(workdir, unit, dtype, job.sft is not None)
        if warning is not None:
            logger.warning("%s", warning)
        if previous is not None:
            ready[unit.index] = previous
    reused = len(ready)
    todo = [u for u in units if u.index not in ready]

    workers = max(1, min(run.workers or usable_cores(), len(todo) or 1))
    with contextlib.ExitStack() as stack:
        pool = None
        if todo:
            config = WorkerConfig(job, tuple(files), run.storage_options)
            pool = stack.enter_context(worker_pool(config, workers, run.start_method))
        tokenizer_file = stack.enter_context(contextlib.ExitStack())
        progress = stack.enter_context(
            contextlib.closing(ConvertProgress(sum(f.size for f in files), run.progress))
        )
        assembly = stack.enter_context(
            ShardAssembly(job, files, units, workdir, Folder(job.output), progress.note)
        )
        # Each unit's canary is checked here before it is sent (canary.py): ~0.4 ms of this
        # process per unit instead of a stall of the worker's tokenizing thread.
        canary = UnitCanary.for_job(job.tokenizer, files, job.text_key, job.txt_mode, job.sft)
        feed = UnitFeed(pool, todo, canary, workers)
        feed.top_up()
        pending = feed.pending
        # tokenizer.json (9 MB for Llama 3, 5-15 ms to encode and write) only matters to the
        # phases after a kill: written beside the units instead of before the first one, once
        # the workers are forked (no thread may run here before) and have their first units,
        # and awaited before the dataset is published.
        tokenizer_file.enter_context(
            beside("shardtok-tokenizer-file", lambda: write_tokenizer_file(workdir, job.tokenizer))
        )
        for result in ready.values():
            progress.unit_done(
                result.input_bytes, result.num_documents, result.num_tokens, reused=True
            )
        frame_settings = [job.frame_size, job.compression_level]
        for next_index in range(len(units)):
            while next_index not in ready:
                feed.top_up()
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    index = pending.pop(future)
                    try:
                        result = future.result()
                    except Exception as exc:  # raised in unit order below, like bad records
                        result = exc
                    ready[index] = result
                    if isinstance(result, UnitResult):
                        progress.unit_done(
                            result.input_bytes, result.num_documents, result.num_tokens, False
                        )
                    else:
                        feed.stop_after(index)  # the run will stop at this unit
            if pool is not None and feed.all_in:
                pool.retire()  # every unit is in: the workers exit beside the assembly
            result = ready.pop(next_index)
            if isinstance(result, Exception):
                raise result
            table = None
            if isinstance(result, UnitResult) and result.frame_settings != frame_settings:
                table = reframed_table(  # persisted under other frame settings
                    workdir, result, dtype, job.frame_size, job.compression_level
                )
            for task in assembly.add(result, table):
                assembly.wrote([write_shard(task)])
        for task in assembly.close_last():
            assembly.wrote([write_shard(task)])
        tokenizer_file.close()
        merged = assembly.publish()
        # Still in the pool's block, whose end waits for the retired workers to exit (~8 ms:
        # a forked worker unmaps its share of this process's memory): the tidying overlaps it.
        # The workers are done with the work folder: every unit's outcome is in.
        if not run.keep_work:
            workdir.remove()
    return ConvertResult(
        str(out), merged.manifest, merged.records_read, merged.documents, dict(merged.rejected),
        units_total=len(units), units_reused=reused, units_tokenized=len(todo),
        seconds=time.monotonic() - started, rejects_path=merged.rejects_path,
        tokenizer_backend=job.tokenizer.backend,
        tokenizer_backend_note=job.tokenizer.backend_note,
        stored_token_bytes=merged.stored_token_bytes, sft=merged.sft_counts,
    )  # fmt: skip
