"""A helper thread that reads and decodes a shard's next frame while the stream uses the current.

Why: decoding is about a third of the CPU an in-process stream spends per batch (zstd, ~40 µs
per 8 x 2048 batch), and python-zstandard (like numpy's large-array loops) releases the GIL
while it works. With DataLoader workers the cores are busy anyway; in one process (``num_workers
=0``: notebooks, TPU hosts, simple scripts) the second core is idle, and this thread puts the
decoding there while the main thread assembles batches.

What stays as it was:

* bounded memory: a reader keeps a fixed number of frames in flight beyond the one it is
  cutting (a slice reader shares 8 among its open shards, at least 2 each), so a slice holds at
  most that many more decoded frames (and their compressed bytes);
* the same tokens in the same order: the thread computes exactly the frames the reader asks
  for, and the reader takes each result where it would have computed it itself, so a frame
  that does not decode (corrupt, a bad mask frame) is raised at the same document as without
  the thread. Compressed bytes are still read on the caller's thread, ahead: a shard cut short
  or a storage error can surface up to that many frames' documents earlier than in place.
* no thread left behind: it starts at the first ``submit`` in the process that submits (a
  forked child that inherits an instance starts its own), and ends on ``close()``, when its
  owner is garbage collected, or at interpreter exit. Nothing is process-wide.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

# cooperate(): a task counts as stuck past 1.5 x recent tasks' CPU plus this, and the caller
# waits for it at most this long.
STALL_MARGIN_S = 0.0002
STALL_WAIT_S = 0.002


class Pending:
    """The result of one submitted task, available once the helper has run it."""

    __slots__ = ("_done", "_value", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def wait(self) -> None:
        self._done.wait()

    def result(self) -> Any:
        """The task's return value, or its exception raised here (in the caller's thread)."""
        self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None  # raised once; no traceback cycle kept
            raise error
        value, self._value = self._value, None
        return value


class _Progress:
    """What the thread is doing, for its owner's ``cooperate``: since when (wall clock, 0 when
    idle) it runs which task, and the CPU its recent tasks took."""

    __slots__ = ("since", "current", "cpu")

    def __init__(self) -> None:
        self.since = 0.0
        self.current: Pending | None = None
        self.cpu = 0.0


def _serve(tasks: SimpleQueue, progress: _Progress) -> None:
    while True:
        item = tasks.get()
        if item is None:
            return
        pending, fn, args = item
        del item
        progress.current, progress.since = pending, time.perf_counter()
        cpu = time.thread_time()
        try:
            pending._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            pending._error = exc
        progress.cpu += (time.thread_time() - cpu - progress.cpu) / 4
        progress.since, progress.current = 0.0, None
        pending._done.set()
        del pending, fn, args  # hold nothing of a finished task while waiting for the next


def _stop(tasks: SimpleQueue, thread: threading.Thread, pid: int) -> None:
    if os.getpid() != pid:  # an inherited copy in a forked child: its thread never ran here
        return
    tasks.put(None)
    if thread is not threading.current_thread():  # a collection can run this in the thread
        thread.join()


class DecodeAhead:
    """One helper thread running submitted tasks in order (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: SimpleQueue | None = None
        self._progress: _Progress | None = None
        self._pid = -1
        self._finalizer: weakref.finalize | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        if self._tasks is None or self._pid != os.getpid():
            self._start()
        pending = Pending()
        self._tasks.put((pending, fn, args))  # type: ignore[union-attr]
        return pending

    def _start(self) -> None:
        tasks: SimpleQueue = SimpleQueue()
        progress = _Progress()
        thread = threading.Thread(
            target=_serve, args=(tasks, progress), name="shardtok-decode-ahead", daemon=True
        )
        thread.start()
        self._tasks, self._pid, self._progress = tasks, os.getpid(), progress
        # The thread holds only its queue, never this object: dropping the owner ends it.
        self._finalizer = weakref.finalize(self, _stop, tasks, thread, self._pid)

    def cooperate(self) -> None:
        """Hand the GIL to the thread if it is stuck waiting for it (the caller, between two
        batches). A thread that returns from decompressing needs the GIL back, and CPython
        gives a waiting thread the GIL only when the holder blocks or after the switch interval
        (5 ms): a busy main thread that merely releases it around numpy calls takes it straight
        back, and the helper then finishes about one frame per 5 ms, fewer than the main thread
        uses. So when the current task has run well past the CPU such tasks take, the caller
        blocks on it (briefly: what is left of it runs at full speed once it has the GIL)."""
        progress = self._progress
        if progress is None:
            return
        since = progress.since
        if since and time.perf_counter() - since > 1.5 * progress.cpu + STALL_MARGIN_S:
            current = progress.current
            if current is not None:
                current._done.wait(STALL_WAIT_S)

    @property
    def running(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive and self._pid == os.getpid()

    def close(self) -> None:
        """End the thread once the tasks already submitted have run (a later ``submit``
        starts a new one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._tasks, self._finalizer, self._pid = None, None, -1
