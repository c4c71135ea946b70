"""A helper thread that decodes a shard's next frames while the stream uses the current one.

Why: decoding is about a third of the CPU an in-process stream spends per batch (zstd, ~40 µs
per 8 x 2048 batch), and python-zstandard (like numpy's large-array loops) releases the GIL
while it works. With DataLoader workers the cores are busy anyway; in one process (``num_workers
=0``: notebooks, TPU hosts, simple scripts) the second core is idle, and this thread puts the
decoding there while the main thread assembles batches. Where decoding is the slower side (long
documents: little Python per batch), a caller whose frame is not ready yet does not wait idle:
it runs the tasks queued behind the helper's current one itself (``Pending.result``), so both
cores decode. The tasks must therefore be safe to run two at a time (the shard readers' are:
each decode takes a zstd context of its own, mask frames are read under a lock).

What stays as it was:

* bounded memory: a reader keeps a fixed number of frames in flight beyond the one it is
  cutting (a slice reader shares 8 among its open shards, at least 2 each), so a slice holds at
  most that many more decoded frames (and their compressed bytes);
* the same tokens in the same order: the frames computed are exactly those the reader asks
  for, and the reader takes each result where it would have computed it itself, so a frame
  that does not decode (corrupt, a bad mask frame) is raised at the same document as without
  the thread. Compressed bytes are still read on the caller's thread, ahead (and mask frames
  decoded there, their errors held for their frame): a shard cut short or a storage error can
  surface up to that many frames' documents earlier than in place.
* no thread left behind: it starts at the first ``submit`` in the process that submits (a
  forked child that inherits an instance starts its own), and ends on ``close()``, when its
  owner is garbage collected, or at interpreter exit. Nothing is process-wide.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any


class Pending:
    """The result of one submitted task, available once the helper (or a caller helping while
    it waits) has run it."""

    __slots__ = ("_done", "_value", "_error", "_tasks")

    def __init__(self, tasks: SimpleQueue | None = None) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._tasks = tasks  # the queue it is in, for ``result`` to help with

    def wait(self) -> None:
        self._done.wait()

    def result(self) -> Any:
        """The task's return value, or its exception raised here (in the caller's thread).

        Until it is ready the caller runs tasks still queued behind the one the helper is on
        (the ones its stream needs next) instead of blocking: where decoding is the slower
        side, the caller's idle time goes into it and both cores decode."""
        done, tasks = self._done, self._tasks
        while tasks is not None and not done.is_set():
            try:
                item = tasks.get_nowait()
            except Empty:
                break
            if item is None:  # the helper's stop: left for it
                tasks.put(None)
                break
            _run(*item)
            error = item[0]._error
            if error is not None and not isinstance(error, Exception):
                raise error  # Ctrl-C in a task run here is this thread's: not held for later
        done.wait()
        if self._error is not None:
            error, self._error = self._error, None  # raised once; no traceback cycle kept
            raise error
        value, self._value = self._value, None
        return value


def _run(pending: Pending, fn: Callable[..., Any], args: tuple) -> None:
    try:
        pending._value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
        pending._error = exc
    pending._done.set()


def _serve(tasks: SimpleQueue) -> None:
    while True:
        item = tasks.get()
        if item is None:
            return
        _run(*item)
        del item  # hold nothing of a finished task while waiting for the next


def _stop(tasks: SimpleQueue, thread: threading.Thread, pid: int) -> None:
    if os.getpid() != pid:  # an inherited copy in a forked child: its thread never ran here
        return
    tasks.put(None)
    if thread is not threading.current_thread():  # a collection can run this in the thread
        thread.join()


class DecodeAhead:
    """One helper thread running submitted tasks in order, with callers waiting for a result
    running queued ones too (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: SimpleQueue | None = None
        self._pid = -1
        self._finalizer: weakref.finalize | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        if self._tasks is None or self._pid != os.getpid():
            self._start()
        pending = Pending(self._tasks)
        self._tasks.put((pending, fn, args))  # type: ignore[union-attr]
        return pending

    def _start(self) -> None:
        tasks: SimpleQueue = SimpleQueue()
        thread = threading.Thread(
            target=_serve, args=(tasks,), name="shardtok-decode-ahead", daemon=True
        )
        thread.start()
        self._tasks, self._pid = tasks, os.getpid()
        # The thread holds only its queue, never this object: dropping the owner ends it.
        self._finalizer = weakref.finalize(self, _stop, tasks, thread, self._pid)

    @property
    def running(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive and self._pid == os.getpid()

    def close(self) -> None:
        """End the thread once the tasks already submitted have run (a later ``submit``
        starts a new one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._tasks, self._finalizer, self._pid = None, None, -1
