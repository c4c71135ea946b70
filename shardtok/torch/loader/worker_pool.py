"""The worker side of ``ShardLoader``: worker processes and the hand-over protocol.

Per worker: a slot ring (shared memory made before the worker starts, None without shared
memory), a result pipe (worker -> main:
``("slot", slot, cu_len, extras, position)``, ``("arrays", batch, position)`` when every slot is
held, ``("end", position)``, ``("stopped",)``, ``("error", pickled exception, traceback)``), a
command pipe (main -> worker: ``("start", state)``, ``("exit", None)``), a semaphore of credits
(one per batch the worker may build ahead) and a stop flag. A worker serves any source with
``_worker_slot``, ``_ring`` and ``_start_stream(state) -> (stream, ring)``: a
``ShardStreamDataset`` or a ``MemmapBatchSource``.

Every piece is made from the loader's multiprocessing context and travels to the worker as a
``Process`` argument, so the protocol is the same under ``fork``, ``forkserver`` and ``spawn``:
a forked worker inherits the objects; a spawned or forkserver one gets them pickled (the source
by value, the ring, pipes, semaphore and flag as descriptors or names of the same memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import signal
import sys
import threading
import time
import traceback

import numpy as np
import torch

from shardtok._process import process_alive
from shardtok.errors import ShardtokError
from shardtok.stream.batch import BATCH_KEYS
from shardtok.torch.transport import SlotRing, _slot_tensors, to_tensors

LIVENESS_S = 5.0  # how long the main process waits for a worker to stop or to exit
WATCH_S = 0.2  # how often a worker's watchdog checks that the main process still exists
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class LoaderWorkerError(ShardtokError):
    """A ShardLoader worker died, or stopped answering within the loader's timeout."""


class WorkerPool:
    """The worker processes of one loader: their rings, pipes, credits and stop flags."""

    def __init__(
        self,
        source,
        count: int,
        prefetch: int,
        context,
        batch_size: int,
        seq_len: int,
        shared: bool = True,
    ):
        slots = min(2 * prefetch + 2, 62)  # room for the batches a caller still holds
        # Without shared memory (shared_memory=False, or no memfd) every batch travels pickled
        # through the worker's pipe: slower, but the same protocol, positions and states.
        self.rings: list[SlotRing | None] = [
            SlotRing(batch_size, seq_len, slots) if shared else None for _ in range(count)
        ]
        self.prefetch = prefetch
        self.credits = [context.Semaphore(0) for _ in range(count)]
        self.stops = [context.RawValue("b", 0) for _ in range(count)]
        self.results, self.commands, self.processes = [], [], []
        self._shut_down = False
        self.owner = parent = os.getpid()
        method = context.get_start_method()
        # The kernel's parent-death signal comes when the *thread* that forked the worker exits:
        # a pool started on another thread (a prefetching thread that ends while persistent
        # workers live on) would lose its workers with it. See _exit_with_main for forkserver.
        death_signal = (
            method != "forkserver" and threading.current_thread() is threading.main_thread()
        )
        for w in range(count):
            # Made just before this worker starts and closed here right after, a result pipe's
            # sending end lives in its worker alone: the worker's death is an EOF.
            result_in, result_out = context.Pipe(duplex=False)
            command_in, command_out = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker_main,
                args=(
                    source,
                    w,
                    count,
                    self.rings[w],
                    result_out,
                    command_in,
                    self.credits[w],
                    self.stops[w],
                    parent,
                    method != "forkserver",
                    death_signal,
                ),
                name=f"shardtok-loader-worker-{w}",
                daemon=True,
            )
            process.start()
            result_out.close()
            command_in.close()
            self.results.append(result_in)
            self.commands.append(command_out)
            self.processes.append(process)
        self.running = [False] * count

    def alive(self) -> bool:
        return bool(self.processes) and all(p.is_alive() for p in self.processes)

    def start(self, worker: int, state: dict | None) -> None:
        self.stops[worker].value = 0
        self.commands[worker].send(("start", state))
        self.running[worker] = True
        for _ in range(self.prefetch):
            self.credits[worker].release()

    def receive(self, worker: int, timeout: float) -> tuple:
        conn, process = self.results[worker], self.processes[worker]
        if timeout and not conn.poll(timeout):
            raise LoaderWorkerError(
                f"ShardLoader worker {worker} (pid {process.pid}) sent no batch in {timeout} s"
            )
        try:
            message = conn.recv()
        except EOFError:
            process.join(LIVENESS_S)
            raise LoaderWorkerError(
                f"ShardLoader worker {worker} (pid {process.pid}) exited unexpectedly with exit "
                f"code {process.exitcode}"
            ) from None
        if message[0] in ("end", "stopped", "error"):
            self.running[worker] = False
            while self.credits[worker].acquire(False):  # the worker takes no more: start clean
                pass
        return message

    def next_batch(self, worker: int, timeout: float) -> tuple[dict | None, dict]:
        """The worker's next batch as tensors and its stream position after it; (None, final
        position) when the worker has no more. A worker's exception is raised here."""
        message = self.receive(worker, timeout)
        kind = message[0]
        if kind == "error":
            raise_worker_error(worker, message)
        if kind == "end":
            return None, message[1]
        if kind == "slot":
            _, slot, cu_len, extras, position = message
            ring = self.rings[worker]
            assert ring is not None  # a worker sends slots only when it has a ring
            batch = _slot_tensors(ring, slot, cu_len, extras)
        else:
            _, arrays, position = message
            batch = to_tensors(arrays)
        self.credits[worker].release()
        return batch, position

    def stop(self, worker: int, timeout: float) -> None:
        """End the worker's current epoch early; frees the slots of batches never taken."""
        if not self.running[worker]:
            return
        self.stops[worker].value = 1
        self.credits[worker].release()  # a worker waiting for credit wakes up and sees the flag
        while True:
            message = self.receive(worker, timeout)
            if message[0] == "slot":
                self.rings[worker].release(message[1])  # type: ignore[union-attr]
            elif message[0] != "arrays":
                return

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        self.shutdown()

    def shutdown(self) -> None:
        # Once only: a collection during shutdown can run an iterator's or a loader's __del__
        # that shuts this pool down again, and a pipe closed twice closes whatever descriptor
        # took its number meanwhile.
        if os.getpid() != self.owner or self._shut_down:  # not ours (a forked copy), or done
            return
        self._shut_down = True
        for w, process in enumerate(self.processes):
            if process.is_alive():
                try:
                    if self.running[w]:
                        self.stop(w, LIVENESS_S)
                    self.commands[w].send(("exit", None))
                except (OSError, LoaderWorkerError):
                    process.kill()  # unresponsive: it cannot be asked
        for process in self.processes:
            process.join(timeout=LIVENESS_S)
            if process.is_alive():
                process.terminate()
                process.join()
        for conn in self.results + self.commands:
            conn.close()
        self.processes, self.results, self.commands = [], [], []


def raise_worker_error(worker: int, message: tuple) -> None:
    _, pickled, text = message
    try:
        exc = pickle.loads(pickled) if pickled is not None else None
    except Exception:
        exc = None
    if not isinstance(exc, BaseException):
        raise LoaderWorkerError(f"ShardLoader worker {worker} failed:\n{text}")
    exc.add_note(f"(raised in ShardLoader worker {worker}; its traceback follows)\n{text}")
    raise exc


# -- the worker process ---------------------------------------------------------------------


def _exit_with_main(parent: int, child_of_main: bool, death_signal: bool) -> None:
    """End this worker within WATCH_S of the main process `parent` dying, whatever killed it."""
    # Two mechanisms. On Linux the kernel sends PR_SET_PDEATHSIG's signal the moment the parent
    # dies: nothing polled, and it reaches a worker busy in code that holds the GIL. SIGKILL,
    # because a forked worker inherits the training script's Python handlers (a SIGTERM handler
    # that saves a checkpoint), and holds nothing that needs cleaning up. It only covers fork and
    # spawn workers of a pool started on the main thread (see WorkerPool): a forkserver worker's
    # parent is the fork server, which exits at EOF on its liveness pipe, and multiprocessing
    # hands every forkserver child a copy of that pipe's write end, so the fork server outlives
    # a dead main process as long as its workers do (the old polling left such workers alive for
    # good while the killed main process was an unreaped zombie). For those, and off Linux, a
    # watchdog thread checks the main process's pid five times a second: a few system calls
    # beside the batch loop, none in it. Watching for EOF on a pipe of our own instead, as
    # convert's workers do, would stall the same way whenever a later child of the main process
    # (a torch DataLoader worker) inherits the write end.
    if death_signal and sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):  # no prctl: the watchdog alone
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    ppid = os.getppid()

    def main_gone() -> bool:
        # process_alive: a main process killed but not yet reaped by its own parent is a zombie,
        # which still takes signal 0.
        return os.getppid() != ppid or not process_alive(parent)

    # The main process may have died before the signal was asked for (then none comes): a fork
    # or spawn worker is then already a child of another process.
    if (child_of_main and ppid != parent) or main_gone():
        os._exit(1)

    def watch() -> None:
        while not main_gone():
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="shardtok-loader-watchdog", daemon=True).start()


def _worker_main(
    dataset,
    worker: int,
    count: int,
    ring: SlotRing | None,
    out,
    commands,
    credits,
    stop,
    parent: int,
    child_of_main: bool,
    death_signal: bool,
) -> None:
    _exit_with_main(parent, child_of_main, death_signal)
    # A forked worker shares the main process's pages until it writes to one, and a garbage
    # collection writes to every object it examines. When a full collection was due in the main
    # process at the fork, each worker's first collection was that full one: ~0.1 s of CPU and a
    # copy of every page holding a tracked object inherited from the main process (torch, the
    # caller's data), which more than doubled the memmap path's CPU with 2 workers in the
    # comparison's read job (0.37 against 0.16 CPU-s per 24 M tokens). What a worker inherits
    # lives as long as the worker: frozen, no collection here examines it.
    gc.freeze()
    torch.set_num_threads(1)
    dataset._worker_slot = (worker, count)
    dataset._ring = ring
    try:
        while True:
            kind, state = commands.recv()  # blocks: _exit_with_main ends an orphan
            if kind == "exit":
                return
            _run_epoch(dataset, ring, state, out, credits, stop)
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        return


def _run_epoch(dataset, ring: SlotRing | None, state, out, credits, stop) -> None:
    try:
        stream, _ = dataset._start_stream(state)
        while True:
            credits.acquire()
            if stop.value:
                out.send(("stopped",))
                return
            try:
                batch = next(stream)
            except StopIteration:
                out.send(("end", stream.state_dict()))
                return
            slot = ring.take_slot() if ring is not None else None
            position = stream.state_dict()
            if slot is None:  # every slot still held by the caller: ordinary memory, pickled
                out.send(("arrays", {k: np.asarray(v) for k, v in batch.items()}, position))
            else:
                extras = {k: v for k, v in batch.items() if k not in BATCH_KEYS}
                out.send(("slot", slot, len(batch["cu_seqlens"]), extras, position))
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the main process
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except Exception:
            pickled = None
        out.send(("error", pickled, traceback.format_exc()))


__all__ = ["LIVENESS_S", "WATCH_S", "LoaderWorkerError", "WorkerPool", "raise_worker_error"]
