"""A worker process of the conversion: its configuration, its per-process state, its lifecycle.

init_worker makes a process a worker once (its encoder, or its SFT pipeline, is built there);
then in a pool of ours (pool.UnitPool) serve_units takes units from a pipe until told to stop and
the worker exits when the main process dies, while an engine's worker calls tokenize_unit. Each
unit is tokenized on the calling thread (unit_tokenizer.py) and persisted by the process's one
writer thread (background.py), which then concludes it, so the next unit may start at once;
that thread also reads the next unit while this one is encoded (unit_reader.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

from shardtok._process import ignore_sigint
from shardtok.convert.inputs.table_pieces import BlockCache
from shardtok.convert.inputs.units import Unit
from shardtok.convert.job.failures import EncoderMismatch, UnitFailure
from shardtok.convert.job.spec import WorkerConfig
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.workdir import WorkDir
from shardtok.convert.tokenizing.canary import Checked
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.worker.background import BackgroundWriter
from shardtok.convert.worker.unit_batches import SFTRecords
from shardtok.convert.worker.unit_reader import ReadAhead, reads_ahead
from shardtok.convert.worker.unit_tokenizer import Scratch, Worker, tokenize

_worker: Worker | None = None  # this process's, once init_worker made it a worker


def _exit_with_main(alive: Connection) -> None:
    # A SIGKILLed main process never tells its pool; an orphan would finish its unit (harmless,
    # the write is atomic) and then wait on the task queue forever. Nothing is ever sent on
    # `alive`: recv returns only with EOF, once every write end is closed, i.e. the main process
    # is gone. Unlike polling getppid this cannot miss a death that happened before the check
    # started, and it works whatever the start method (under forkserver the parent is the fork
    # server, not the main process).
    with contextlib.suppress(EOFError, OSError):
        alive.recv()
    os._exit(1)


def init_worker(
    config: WorkerConfig, alive: Connection | None = None, alive_w: Connection | None = None
) -> None:
    """Make this process a worker for `config`. In a pool of ours, `alive` is the read end of a
    pipe whose write end only the pool's parent holds (`alive_w`: this process's inherited copy,
    closed here): the worker exits when the parent dies. Without them (an engine's worker, whose
    lifetime the engine manages) nothing is watched."""
    global _worker
    # Before anything slow: a forked worker inherits the write end, and must drop it for the
    # EOF to come when the main process dies.
    if alive_w is not None:
        alive_w.close()
    if alive is not None:
        threading.Thread(target=_exit_with_main, args=(alive,), daemon=True).start()
    job = config.job
    # One of the two, never a former configuration's other (a process made a worker twice).
    _worker = Worker(
        config,
        WorkDir(job.output, config.storage_options),
        BatchEncoder(job.tokenizer) if job.sft is None else None,
        SFTRecords(job.sft, job.tokenizer) if job.sft is not None else None,
        BlockCache(),
    )


def tokenize_unit(unit: Unit) -> UnitResult | UnitFailure | EncoderMismatch:
    """Tokenize `unit` and persist it in the work folder (runs in a worker process).

    A failure (the unit's first bad record under --on-bad-record error, or a tokenizer backend
    mismatch) is persisted too, with the mode that found it, then returned."""
    ending: list = []
    start_unit(unit, lambda outcome, error: ending.append((outcome, error)))
    _sink().drain()
    outcome, error = ending[0]
    if error is not None:
        raise error
    return outcome


Deliver = Callable[[object, BaseException | None], None]


def start_unit(
    unit: Unit,
    deliver: Deliver,
    checked: Checked | None = None,
    ahead: ReadAhead | None = None,
    read_next: Callable[[], None] | None = None,
) -> None:
    """Tokenize `unit` on this thread and return once its last batch is handed to the writer
    thread, which persists the unit and then calls `deliver(outcome, None)` (outcome as
    :func:`tokenize_unit` returns it) or `deliver(None, error)`. The next unit may start at
    once: each unit's files, verdict and marker are its own (see background.py). `checked`:
    the canary's verdict from the main process, if it has one (see canary.py); `ahead` and
    `read_next`: see unit_tokenizer.tokenize."""
    worker = _worker
    assert worker is not None, "init_worker was not called"
    workdir = worker.workdir
    scratch = Scratch(workdir, unit.index)
    try:
        conclusion = tokenize(unit, worker, scratch, _sink(), checked, ahead, read_next)
    except BaseException:
        scratch.close()
        raise
    stop_mode = worker.config.stop_at_bad_record

    def conclude(error: BaseException | None) -> None:
        try:
            try:
                outcome = conclusion(error)
            finally:
                scratch.close()
            if not isinstance(outcome, UnitResult):
                workdir.save_failure(outcome, stop_mode)
        except BaseException as exc:
            deliver(None, exc)
            return
        deliver(outcome, None)

    _sink().conclude(conclude)


def serve_units(
    config: WorkerConfig,
    tasks: Connection,
    results: Connection,
    alive: Connection | None = None,
    alive_w: Connection | None = None,
) -> None:
    """A worker process of pool.UnitPool: (task id, unit, canary verdict or None) from
    `tasks` until None, (task id, outcome, error) on `results` as each unit is persisted (sent
    by the writer thread, while this thread tokenizes the next unit)."""
    ignore_sigint()
    init_worker(config, alive, alive_w)
    lock = threading.Lock()  # the writer thread sends; this one only when a unit cannot start

    def send(task_id: int, outcome, error: BaseException | None) -> None:
        with lock:
            try:
                results.send((task_id, outcome, error))
            except Exception as exc:  # an outcome or exception that does not pickle
                what = error if error is not None else outcome
                results.send(
                    (task_id, None, RuntimeError(f"{type(what).__name__}: {what} (unsent: {exc})"))
                )

    # The pool sends units ahead: the next one, if already here once a unit is read, is read
    # on the writer thread while this one is encoded (unit_reader.py).
    task, ahead = tasks.recv(), None
    while task is not None:
        task_id, unit, checked = task
        received: list = []  # (the next task, its ReadAhead), if it came while this unit ran

        def read_next(received: list = received) -> None:
            if not tasks.poll():
                return
            following = tasks.recv()
            reading = None
            if following is not None and reads_ahead(following[1], config.files):
                assert _worker is not None
                sft = _worker.sft
                fields = sft.fields if sft is not None else None
                reading = ReadAhead(following[1], config, sft is not None, fields, _worker.blocks)
            received.append((following, reading))
            if reading is not None:
                _sink().submit(reading.run)

        try:
            start_unit(unit, functools.partial(send, task_id), checked, ahead, read_next)
        except Exception as exc:
            send(task_id, None, exc)
        task, ahead = received[0] if received else (tasks.recv(), None)
    _sink().close()


# The writer thread this process's units share, and the process it was started in (a forked
# child inherits the object, not the thread).
_sink_of: tuple[int, BackgroundWriter] | None = None


def _sink() -> BackgroundWriter:
    global _sink_of
    if _sink_of is None or _sink_of[0] != os.getpid():
        # Room for about three units' jobs (a 256 KiB unit has five or six: its files opened,
        # its batch, its last frame, publishing, the conclusion), so the tokenizing thread does
        # not wait on the queue when the writer is a unit behind (depth 4 cost it 3-5 ms per
        # 16 MB job). The jobs hold at most ~16 batches of tokens (~1 MB each) in memory.
        _sink_of = (os.getpid(), BackgroundWriter(depth=16))
    return _sink_of[1]
