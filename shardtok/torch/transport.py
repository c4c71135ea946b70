"""Moving batches from DataLoader workers to the main process through shared memory, zero-copy.

Why: the DataLoader pickles every batch through a pipe; torch moves each tensor into a fresh
shared-memory segment and passes its file descriptor through a socket, per tensor, per batch.
On small machines that costs about a millisecond per batch, more than building the batch.

How: each worker owns a ring of slots in one ``memfd`` mapping and builds batches directly in a
free slot (the batcher's allocator). What travels through the DataLoader's queue is a tiny
handle; its unpickling in the main process maps the ring once (the fd is sent, via
``multiprocessing.reduction.DupFd``, until the main process acknowledges it) and returns the
batch as plain tensors that view the slot. When the last tensor viewing a slot is freed, a
finalizer marks the slot free for the worker. A worker never waits: with every slot still held
(a caller keeping many batches alive), it builds the batch in ordinary memory and the default
torch path carries it. So a batch is never overwritten while any tensor can still see it.

A slot holds every array of a batch (``source_ids`` too); only the scalars travel pickled
beside the handle (a numpy array there would come out as a tensor, as on every other path).
"""

from __future__ import annotations

import mmap
import os
import weakref
from functools import partial
from multiprocessing.reduction import DupFd

import numpy as np
import torch

from shardtok._process import process_alive
from shardtok.stream.batch import BATCH_KEYS, allocate_arrays
from shardtok.torch.model_inputs import model_batch, refuse_collation

ALIGN = 64
DEFAULT_SLOTS = 16
FREE, BUSY = 0, 1
_HEADER = ALIGN  # control bytes: one per slot (<= 63 slots) and the acknowledgement byte
_ACK = ALIGN - 1


def _layout(
    batch_size: int, seq_len: int
) -> tuple[list[tuple[str, int, np.dtype, tuple[int, ...], int]], int]:
    """(key, byte offset in slot, dtype, shape, element count) per array (those of
    allocate_arrays, which np.empty makes without touching their memory), and the slot size."""
    fields, at = [], 0
    for key, arr in allocate_arrays(batch_size, seq_len).items():
        fields.append((key, at, arr.dtype, arr.shape, arr.size))
        at += -(-arr.nbytes // ALIGN) * ALIGN
    return fields, at


class SlotRing:
    """Worker side: the ring, its allocator, and the packaging of finished batches."""

    def __init__(
        self, batch_size: int, seq_len: int, slots: int = DEFAULT_SLOTS, fd: int | None = None
    ):
        if not 1 <= slots < _ACK:
            raise ValueError(f"slots must lie in [1, {_ACK - 1}]")
        self.batch_size, self.seq_len, self.slots = batch_size, seq_len, slots
        self.fields, self.slot_bytes = _layout(batch_size, seq_len)
        self.size = _HEADER + slots * self.slot_bytes
        if fd is None:
            fd = os.memfd_create("shardtok-batches", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.size)
        self.fd = fd
        self.mm = mmap.mmap(self.fd, self.size)
        self.control = np.frombuffer(self.mm, dtype=np.uint8, count=_HEADER)
        self.name = os.urandom(12).hex()  # identifies this ring in the main process's cache
        self.pid = os.getpid()
        self._current: int | None = None
        self.fallbacks = 0
        self._slot_arrays: dict[int, dict[str, np.ndarray]] = {}  # the allocator's, per slot
        self._watch: dict[int, weakref.ref] = {}  # slot -> its tensors' base (local batches)

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "memfd_create")

    def __reduce__(self):
        # A ShardLoader makes its workers' rings before starting them. A forked worker inherits
        # the mapping; a spawned or forkserver one gets this pickle, and DupFd is how the
        # standard library hands a descriptor to a child it starts (as for its Connections
        # and shared ctypes): the child maps the same memory.
        return _attach_ring, (self.batch_size, self.seq_len, self.slots, DupFd(self.fd))

    def allocate(self, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
        """The batcher's allocator: arrays in a free slot, or ordinary arrays if none is free."""
        self._current = None
        if (batch_size, seq_len) == (self.batch_size, self.seq_len):
            # The lowest free slot: the most recently used memory, likely still in cache (a
            # batch written into a slot last touched 16 batches ago costs ~1.3x more).
            control = self.control
            for slot in range(self.slots):
                if control[slot] == FREE:
                    control[slot] = BUSY
                    self._current = slot
                    arrays = self._slot_arrays.get(slot)
                    if arrays is None:  # made once per slot: they only ever view it
                        arrays = self._slot_arrays[slot] = self._views(slot)
                    return dict(arrays)
        self.fallbacks += 1
        return allocate_arrays(batch_size, seq_len)

    def _views(self, slot: int) -> dict[str, np.ndarray]:
        base = _HEADER + slot * self.slot_bytes
        out = {}
        for key, offset, dtype, shape, count in self.fields:
            arr = np.frombuffer(self.mm, dtype=dtype, count=count, offset=base + offset)
            out[key] = arr.reshape(shape)
        return out

    def take_slot(self) -> int | None:
        """The slot the last allocated batch lives in (None: ordinary memory), handed over."""
        slot, self._current = self._current, None
        return slot

    def package(self, batch: dict, *, labels_format: str, local: bool = False):
        """What to yield: a handle that unpickles to the model's batch in the main process,
        or (`local`, no process boundary) that batch itself; ordinary tensors for a fallback
        batch. `labels_format`: the batch's (``model_inputs.model_batch``)."""
        slot = self.take_slot()
        if slot is None:
            return model_batch(to_tensors(batch), labels_format)
        extras = {k: v for k, v in batch.items() if k not in BATCH_KEYS}
        if local:
            tensors = _slot_tensors(self, slot, len(batch["cu_seqlens"]), extras)
            return model_batch(tensors, labels_format)
        return _SlotBatch(self, slot, len(batch["cu_seqlens"]), extras, labels_format)

    def release(self, slot: int) -> None:
        self.control[slot] = FREE


def _attach_ring(batch_size: int, seq_len: int, slots: int, fd) -> SlotRing:
    received = fd.detach()
    os.set_inheritable(received, False)  # spawn passed it inheritable; the ring's own is not
    return SlotRing(batch_size, seq_len, slots, fd=received)


class _SlotBatch(dict):
    """Pickles to a handle; unpickles (in the main process) to a dict of tensors.

    An empty dict to torch: the DataLoader's ``default_convert`` copies a mapping it is handed
    (here: the handle itself, unchanged), and its collate, batching batches, is refused."""

    __slots__ = ("ring", "slot", "cu_len", "extras", "labels_format")

    def __init__(self, ring: SlotRing, slot: int, cu_len: int, extras: dict, labels_format: str):
        super().__init__()
        self.ring, self.slot, self.cu_len, self.extras = ring, slot, cu_len, extras
        self.labels_format = labels_format

    def __copy__(self) -> _SlotBatch:
        refuse_collation(self.ring.batch_size)
        return self

    def __reduce__(self):
        ring = self.ring
        fd = DupFd(ring.fd) if ring.control[_ACK] == 0 else None
        layout = (ring.batch_size, ring.seq_len, ring.slot_bytes, ring.size)
        where = (ring.name, ring.pid, fd, layout, self.slot, self.cu_len)
        return (_open_batch, (*where, self.extras, self.labels_format))


class _MappedRing:
    """Main side: one worker's ring, mapped once."""

    def __init__(self, mm: mmap.mmap, pid: int, batch_size: int, seq_len: int):
        self.mm, self.pid = mm, pid
        self.batch_size, self.seq_len = batch_size, seq_len
        self.fields, self.slot_bytes = _layout(batch_size, seq_len)
        self.control = np.frombuffer(mm, dtype=np.uint8, count=_HEADER)
        self._watch: dict[int, weakref.ref] = {}

    def release(self, slot: int) -> None:
        self.control[slot] = FREE


_RINGS: dict[str, _MappedRing] = {}


def _map_ring(name: str, pid: int, fd, layout) -> _MappedRing:
    batch_size, seq_len, _, size = layout
    ring = _RINGS.get(name)
    if fd is not None:
        received = fd.detach()
        try:
            if ring is None:
                for old in [n for n, r in _RINGS.items() if not process_alive(r.pid)]:
                    del _RINGS[old]  # tensors still viewing it keep the mapping alive
                ring = _RINGS[name] = _MappedRing(
                    mmap.mmap(received, size), pid, batch_size, seq_len
                )
                ring.control[_ACK] = 1
        finally:
            os.close(received)
    if ring is None:
        raise RuntimeError(f"batch from shared-memory ring {name} of pid {pid}, never mapped here")
    return ring


def _open_batch(
    name: str, pid: int, fd, layout, slot: int, cu_len: int, extras: dict, labels_format: str
) -> dict:
    tensors = _slot_tensors(_map_ring(name, pid, fd, layout), slot, cu_len, extras)
    return model_batch(tensors, labels_format)


def _slot_tensors(ring: SlotRing | _MappedRing, slot: int, cu_len: int, extras: dict) -> dict:
    """Tensors viewing one slot; the slot is released when the last of them is freed."""
    block = np.frombuffer(
        ring.mm, dtype=np.uint8, count=ring.slot_bytes, offset=_HEADER + slot * ring.slot_bytes
    )
    # Every array below is a numpy view whose base is `block`; the tensors keep their arrays
    # alive, so `block` dies (and the slot goes back to the worker) with the last tensor. A
    # weak reference with a callback (kept by the ring until the slot is used again) costs a
    # fifth of a weakref.finalize, which matters in process at ~100 µs per batch.
    ring._watch[slot] = weakref.ref(block, partial(_released, ring.control, slot))
    out: dict = {}
    for key, offset, dtype, shape, _count in ring.fields:
        if key == "cu_seqlens":  # its used part
            shape = (cu_len,)
        out[key] = torch.from_numpy(np.ndarray(shape, dtype, buffer=block, offset=offset))
    for key, value in extras.items():  # the scalars; an array there becomes a tensor as well
        out[key] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return out


def _released(control: np.ndarray, slot: int, _ref) -> None:
    control[slot] = FREE


def to_tensors(batch: dict) -> dict:
    """numpy arrays -> tensors sharing their memory; other values unchanged."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
