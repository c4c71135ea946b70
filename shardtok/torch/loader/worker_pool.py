"""The worker side of ``ShardLoader``: worker processes and the hand-over protocol.

Per worker: a slot ring (shared memory made before the fork), a result pipe (worker -> main:
``("slot", slot, cu_len, extras, position)``, ``("arrays", batch, position)`` when every slot is
held, ``("end", position)``, ``("stopped",)``, ``("error", pickled exception, traceback)``), a
command pipe (main -> worker: ``("start", state)``, ``("exit", None)``), a semaphore of credits
(one per batch the worker may build ahead) and a stop flag. A worker serves any source with
``_worker_slot``, ``_ring`` and ``_start_stream(state) -> (stream, ring)``: a
``ShardStreamDataset`` or a ``MemmapBatchSource``.
"""

from __future__ import annotations

import os
import pickle
import traceback

import numpy as np
import torch

from shardtok.errors import ShardtokError
from shardtok.stream.batch import BATCH_KEYS
from shardtok.torch.transport import SlotRing, _slot_tensors, to_tensors

LIVENESS_S = 5.0  # how often a blocked side checks that the other side still exists


class LoaderWorkerError(ShardtokError):
    """A ShardLoader worker died, or stopped answering within the loader's timeout."""


class WorkerPool:
    """The worker processes of one loader: their rings, pipes, credits and stop flags."""

    def __init__(self, source, count: int, prefetch: int, context, batch_size: int, seq_len: int):
        slots = min(2 * prefetch + 2, 62)  # room for the batches a caller still holds
        self.rings = [SlotRing(batch_size, seq_len, slots) for _ in range(count)]
        self.prefetch = prefetch
        self.credits = [context.Semaphore(0) for _ in range(count)]
        self.stops = [context.RawValue("b", 0) for _ in range(count)]
        self.results, self.commands, self.processes = [], [], []
        self.owner = parent = os.getpid()
        for w in range(count):
            # Made just before this worker's fork and closed here right after it, a result
            # pipe's sending end lives in its worker alone: the worker's death is an EOF.
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
            batch = _slot_tensors(self.rings[worker], slot, cu_len, extras)
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
                self.rings[worker].release(message[1])
            elif message[0] != "arrays":
                return

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        self.shutdown()

    def shutdown(self) -> None:
        if os.getpid() != self.owner:  # a forked copy (collected in a child): not ours to end
            return
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
        self.processes = []


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


def _worker_main(
    dataset,
    worker: int,
    count: int,
    ring: SlotRing,
    out,
    commands,
    credits,
    stop,
    parent: int,
) -> None:
    torch.set_num_threads(1)
    dataset._worker_slot = (worker, count)
    dataset._ring = ring
    try:
        while True:
            while not commands.poll(LIVENESS_S):
                if os.getppid() != parent:
                    return
            kind, state = commands.recv()
            if kind == "exit":
                return
            _run_epoch(dataset, ring, state, out, credits, stop, parent)
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        return


def _run_epoch(dataset, ring: SlotRing, state, out, credits, stop, parent: int) -> None:
    try:
        stream, _ = dataset._start_stream(state)
        while True:
            while not credits.acquire(timeout=LIVENESS_S):
                if os.getppid() != parent:
                    return
            if stop.value:
                out.send(("stopped",))
                return
            try:
                batch = next(stream)
            except StopIteration:
                out.send(("end", stream.state_dict()))
                return
            slot = ring.take_slot()
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


__all__ = ["LIVENESS_S", "LoaderWorkerError", "WorkerPool", "raise_worker_error"]
