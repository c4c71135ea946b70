"""One background thread that runs a worker's writes in order, beside the tokenizer.

Why: a worker's frame compression (zstd), crc32s and file writes take ~6% of its time, and all
of them release the GIL; run on their own thread they overlap with the next batch's tokenizing
instead of adding to it. The CPU they cost is the same (the benchmark reports CPU per token as
well as wall clock). tiktoken 0.14 releases the GIL while it encodes but takes it back after
every call, so this thread's Python between its C calls makes the tokenizing thread wait when a
call returns meanwhile (encoder._Joiner makes those calls few: one per run of documents).

Work that releases the GIL belongs here: a job that holds it (say, `tokenizers`' encode)
stalls the tokenizing thread every time that thread wants the GIL back. Two such jobs are
worth it: the worker's canary, a small one (0.5% of the input), which costs no more here than
in line; and reading the next unit (unit_reader.ReadAhead: ~1 ms of parsing per 256 KiB unit),
submitted just before the tokenizing thread goes into tiktoken for ~15 ms. Jobs run in the order
they were submitted; the queue is bounded, so a slow disk holds the tokenizer back instead of
letting batches pile up in memory.

A worker keeps one writer for its whole life: a thread started and joined per unit cost ~2% of
a worker's time with 256 KiB units. Each unit's jobs end with :meth:`conclude`, whose job
finishes the unit on this thread (its verdict, its marker, its result sent to the main
process), so the tokenizing thread goes straight on to the next unit instead of waiting at
every unit's end for its last frame's compression and its files' publishing (~1 ms a unit).
Failures stay with their unit: a job's failure skips the later jobs of its unit only, and is
handed to that unit's conclusion (or raised by a submit of the same unit).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

_STOP = object()


class _Conclusion:
    def __init__(self, job: Callable[[BaseException | None], object]):
        self.job = job


class BackgroundWriter:
    """Runs submitted jobs one after another on a thread of its own.

    Jobs come in units (:meth:`conclude` ends one). A job's exception is raised again by the
    next :meth:`submit` of its unit, or handed to the unit's conclusion, or raised by
    :meth:`drain` / :meth:`close`; the unit's later jobs are skipped. Use it as a context
    manager: leaving it waits for every job (an exception already on its way out is not
    masked by a job's)."""

    def __init__(self, depth: int = 2):
        self._jobs: queue.Queue = queue.Queue(maxsize=depth)
        # The submitter's unit (a counter), and the first failure of the unit now running on
        # the thread: [unit, exception, raised to the submitter], replaced whole, never edited
        # but for the flag, which only the submitter sets.
        self._unit = 0
        self._failure: list | None = None
        self._late: BaseException | None = None  # a conclusion's own failure
        self._thread = threading.Thread(target=self._run, name="shardtok-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            unit, job = self._jobs.get()
            if job is _STOP:
                return
            failure = self._failure
            if isinstance(job, threading.Event):
                job.set()
            elif isinstance(job, _Conclusion):
                self._failure = None
                error = failure[1] if failure is not None and not failure[2] else None
                try:
                    job.job(error)
                except BaseException as exc:  # its own: not the next unit's, raised by close
                    self._late = self._late or exc
            elif failure is None:
                try:
                    job()
                except BaseException as exc:  # handed to the submitting thread
                    self._failure = [unit, exc, False]

    def _raise(self) -> None:
        failure = self._failure
        if failure is not None and failure[0] == self._unit and not failure[2]:
            failure[2] = True
            raise failure[1]

    def submit(self, job: Callable[[], object]) -> None:
        self._raise()
        self._jobs.put((self._unit, job))

    def conclude(self, job: Callable[[BaseException | None], object]) -> None:
        """End the current unit: `job(error)` runs after every job submitted so far, whatever
        happened to them (`error`: the unit's first failure not yet raised by a submit, or
        None). It must handle its own failures (one that escapes skips nothing, and is raised
        by :meth:`drain` or :meth:`close`). Never waits for the thread (unless the queue is full)."""
        self._jobs.put((self._unit, _Conclusion(job)))
        self._unit += 1

    def drain(self) -> None:
        """Wait for every job submitted so far; raise the first failure among them not yet
        raised, if any. The writer stays usable: the jobs submitted after this run again."""
        done = threading.Event()
        self._jobs.put((self._unit, done))  # set by the thread even after a failure
        done.wait()
        self._unit += 1
        self._raise_left()

    def _raise_left(self) -> None:
        """Once the thread is idle: raise a conclusion's own failure, else the first job
        failure no submit raised; either way none is left for later."""
        failure, self._failure = self._failure, None
        late, self._late = self._late, None
        if late is not None:
            raise late
        if failure is not None and not failure[2]:
            raise failure[1]

    def close(self) -> None:
        """Wait for every submitted job; raise the first failure not yet raised, if any."""
        if self._thread.is_alive():
            self._jobs.put((self._unit, _STOP))
            self._thread.join()
        self._raise_left()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(BaseException):  # the exception already leaving wins
            self.close()
