"""One background thread that runs a worker's writes in order, beside the tokenizer.

Why: a worker's frame compression (zstd), crc32s and file writes take ~6% of its time, and all
of them release the GIL, as does tiktoken's encode; run on their own thread they overlap with
the next batch's tokenizing instead of adding to it. The CPU they cost is the same (the
benchmark reports CPU per token as well as wall clock).

Work that releases the GIL belongs here: a job that holds it (say, `tokenizers`' encode)
stalls the tokenizing thread every time that thread wants the GIL back. The worker's canary is
the one such job, and a small one (0.5% of the input), which costs no more here than in line. Jobs run in the order
they were submitted; the queue is bounded, so a slow disk holds the tokenizer back instead of
letting batches pile up in memory.

A worker keeps one writer for its whole life and :meth:`drain` s it at each unit's end: a thread
started and joined per unit cost ~2% of a worker's time with 256 KiB units.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

_STOP = object()


class BackgroundWriter:
    """Runs submitted jobs one after another on a thread of its own.

    A job's exception is raised again by the next :meth:`submit` or by :meth:`close`, and
    the jobs after it are skipped. Use it as a context manager: leaving it waits for every
    job (an exception already on its way out is not masked by a job's)."""

    def __init__(self, depth: int = 2):
        self._jobs: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None  # kept: later jobs stay skipped
        self._raised = False
        self._thread = threading.Thread(target=self._run, name="shardtok-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            if isinstance(job, threading.Event):
                job.set()
            elif self._error is None:
                try:
                    job()
                except BaseException as exc:  # handed to the submitting thread
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error

    def submit(self, job: Callable[[], object]) -> None:
        self._raise()
        self._jobs.put(job)

    def drain(self) -> None:
        """Wait for every job submitted so far; raise the first failure among them, if any.
        The writer stays usable: the jobs submitted after this run again."""
        done = threading.Event()
        self._jobs.put(done)  # set by the thread even after a failure (later jobs are skipped)
        done.wait()
        error, raised = self._error, self._raised
        self._error, self._raised = None, False
        if error is not None and not raised:
            raise error

    def close(self) -> None:
        """Wait for every submitted job; raise the first one's exception, if any."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join()
        self._raise()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(BaseException):  # the exception already leaving wins
            self.close()
