"""Worker processes of a conversion: the cores to use, the start method, the tokenizing pool.

The one-command convert and run-units tokenize in :func:`worker_pool` (a UnitPool); the merge
writes shards in a plain pool of :func:`mp_context` (its tasks need no worker state).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import multiprocessing.process
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import connection, resource_tracker

from shardtok._process import mp_context
from shardtok.convert.worker.process import WorkerConfig, serve_units
from shardtok.errors import ShardtokError


class WorkerLost(ShardtokError, BrokenProcessPool):
    """A worker process ended while it held units (killed, out of memory): not the data's
    fault nor a bug, so the command prints it as one line; a rerun resumes."""


class UnitPool:
    """Worker processes that tokenize units: :meth:`submit` gives a Future of the unit's
    outcome (worker.tokenize_unit's).

    Not a ProcessPoolExecutor: there, a worker returns a unit's outcome only once the unit is
    persisted, and gets its next unit only then, so every unit's end waited for its last
    frame's compression and its files' publishing (~1 ms), then for a round trip through the
    main process. Here each worker has up to `_AHEAD` units sent ahead on a pipe of its own:
    its tokenizing thread starts the next unit as soon as the last one's text is tokenized,
    and its writer thread sends each outcome once persisted (worker.serve_units). Units go to
    the worker with the fewest in hand, so a slow unit delays no other worker.

    A worker that dies (killed, out of memory) fails its units and every unit not yet sent
    with WorkerLost (a BrokenProcessPool), as ProcessPoolExecutor does. Workers exit when this
    process dies, however it dies (see worker.py). Only the collector thread reaps them."""

    _AHEAD = 3

    def __init__(self, config: WorkerConfig, workers: int, start_method: str | None = None):
        context = mp_context(start_method)
        # This process only ever holds the write end; it is never written.
        self._alive_r, self._alive_w = context.Pipe(duplex=False)
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Future, tuple]] = collections.deque()
        self._workers: list[_Worker] = []
        self._ids = itertools.count()
        self._broken: str | None = None
        self._closing = False
        try:
            with _sigint_held(context):
                for number in range(workers):
                    tasks_r, tasks_w = context.Pipe(duplex=False)
                    results_r, results_w = context.Pipe(duplex=False)
                    process = context.Process(
                        target=serve_units, name=f"shardtok-convert-{number}", daemon=True,
                        args=(config, tasks_r, results_w, self._alive_r, self._alive_w),
                    )  # fmt: skip
                    process.start()
                    # The worker's ends: closed here, so that its death is an EOF here.
                    tasks_r.close()
                    results_w.close()
                    self._workers.append(_Worker(process, tasks_w, results_r))
        except BaseException as exc:
            self._stop_workers()
            if isinstance(exc, KeyboardInterrupt):
                self._terminate()
            for worker in self._workers:
                worker.process.join()
            raise
        self._collector = threading.Thread(
            target=self._collect, name="shardtok-pool-results", daemon=True
        )
        self._collector.start()

    def submit(self, unit, checked=None) -> Future:
        """The Future of `unit`'s outcome; cancel() works until the unit is sent to a worker.
        `checked`: the canary's verdict on the unit's first document, or None (canary.py)."""
        future: Future = Future()
        with self._lock:
            if self._broken is not None:
                future.set_exception(WorkerLost(self._broken))
                return future
            if self._closing:
                raise RuntimeError("the pool is shut down")
            self._queue.append((future, (unit, checked)))
            self._dispatch()
        return future

    def _dispatch(self) -> None:
        # Under the lock. Sends never block: a pipe holds far more than _AHEAD units.
        while self._queue and not self._closing:
            live = [w for w in self._workers if w.running is not None]
            if not live:
                return
            worker = min(live, key=lambda w: len(w.running))
            if len(worker.running) >= self._AHEAD:
                return
            future, (unit, checked) = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            task_id = next(self._ids)
            worker.running[task_id] = future
            # A worker that is gone: its sentinel says so to the collector.
            with contextlib.suppress(OSError):
                worker.tasks.send((task_id, unit, checked))

    def _collect(self) -> None:
        while True:
            with self._lock:
                live = [w for w in self._workers if w.running is not None]
            if not live:
                return
            waitables: dict = {}
            for worker in live:
                waitables[worker.results] = worker
                waitables[worker.process.sentinel] = worker
            for ready in connection.wait(list(waitables)):
                worker = waitables[ready]
                if worker.running is None:
                    continue
                if ready is worker.results:
                    try:
                        message = worker.results.recv()
                    except (EOFError, OSError):
                        message = None
                    if message is not None:
                        self._finish(worker, *message)
                        continue
                # Exited: take what it sent before, then fail what it still held.
                while True:
                    try:
                        if not worker.results.poll():
                            break
                        self._finish(worker, *worker.results.recv())
                    except (EOFError, OSError):
                        break
                worker.process.join()
                self._lost(worker)

    def _finish(self, worker: _Worker, task_id: int, outcome, error) -> None:
        with self._lock:
            future = worker.running.pop(task_id, None) if worker.running is not None else None
            self._dispatch()
        if future is None:
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)

    def _lost(self, worker: _Worker) -> None:
        with self._lock:
            held, worker.running = worker.running or {}, None
            failed = list(held.values())
            if held or not self._closing:
                code = worker.process.exitcode
                self._broken = (
                    f"a conversion worker process ended abruptly (exit code {code}) while "
                    "tokenizing; run the conversion again to resume it"
                )
                failed += [future for future, _ in self._queue]
                self._queue.clear()
        for future in failed:
            if not future.done():
                future.set_exception(WorkerLost(self._broken))

    def retire(self) -> None:
        """Tell the workers to exit, once every unit is done: they exit (~10 ms: a forked
        worker unmaps its parent's memory) while the caller writes the last shard;
        :meth:`close` waits for them."""
        self._stop_workers()

    def close(self) -> None:
        """Cancel the units not yet sent, let the workers finish the ones they hold and exit,
        and wait for them."""
        with self._lock:
            for future, _ in self._queue:
                future.cancel()
            self._queue.clear()
        self._stop_workers()
        self._collector.join()
        for worker in self._workers:
            worker.tasks.close()
        self._alive_r.close()
        self._alive_w.close()

    def interrupt(self) -> None:
        """Ctrl-C: end the workers now rather than after the units they hold (a unit's files are
        published atomically, so a rerun redoes the unfinished ones); :meth:`close` still waits
        for them to exit."""
        self._stop_workers()
        self._terminate()

    def _terminate(self) -> None:
        for worker in self._workers:
            with contextlib.suppress(OSError):  # reaped already
                worker.process.terminate()

    def _stop_workers(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for worker in self._workers:
                with contextlib.suppress(OSError):  # one that is gone already
                    worker.tasks.send(None)


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    tasks: connection.Connection
    results: connection.Connection
    # task id -> its Future, for the units sent and not yet back; None once the worker is gone
    running: dict[int, Future] | None = field(default_factory=dict)


@contextlib.contextmanager
def worker_pool(
    config: WorkerConfig, workers: int, start_method: str | None = None
) -> Iterator[UnitPool]:
    """`workers` processes ready to tokenize units. Start it before anything starts a thread
    here (tqdm's monitor), so forking is safe; fork also spares each worker re-importing and
    unpickling. Leaving it waits for the workers (see :meth:`UnitPool.close`)."""
    pool = UnitPool(config, workers, start_method)
    try:
        yield pool
    except KeyboardInterrupt:
        pool.interrupt()
        raise
    finally:
        pool.close()


@contextlib.contextmanager
def _sigint_held(context) -> Iterator[None]:
    """Ctrl-C held back while workers start; raised here once they are.

    Each worker inherits SIGINT blocked (through fork, and through exec under spawn and
    forkserver) and keeps a Ctrl-C pending until it has chosen to ignore it
    (worker.serve_units): none prints a traceback of its own start-up. And no Ctrl-C is raised
    halfway through a start (a spawned worker whose data was never sent would print one)."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no masks, and no process groups
        yield
        return
    if context.get_start_method() != "fork":
        # The resource tracker, started with the first worker otherwise, unblocks SIGINT once
        # it has spawned itself: started before the mask is set, it cannot undo it.
        resource_tracker.ensure_running()
    # The mask is this thread's: a thread of a library (a tokenizer's pool) may still take the
    # signal, and Python would raise it here, so the handler only notes it meanwhile.
    caught: list[int] = []
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if handler is not None:  # None: not installed from Python, so it cannot be restored
            signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)
