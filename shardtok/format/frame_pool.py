"""Memory for decoded frames, used again once no document of the frame is alive.

Why: a stream hands documents on as views of their decoded frame, so a frame's memory lives as
long as its last document (in a shuffle buffer, a long time). Asking the allocator for 1 MiB per
frame then gets fresh pages from the kernel each time (a large block freed out of order goes
back to it), and the page faults that fill them cost as much as decompressing the frame: on a
one-shard corpus with a 4,096-document shuffle buffer, 46,000 faults in the 0.2 s that 24 M
tokens took, about 40% of the stream's CPU (benchmarks/results/stream.md, issue 18). Decoding
into buffers kept here touches each page once.

A buffer is free when no array views it any more: every numpy view of it (a document, a frame
array, a slice of a slice: numpy points them all at the buffer itself) holds a reference to it,
so its reference count falls back to what the pool alone holds. The count is compared with one
taken the same way from a buffer nothing else holds, so the rule does not depend on how an
interpreter counts the references of its own stack. A buffer still viewed anywhere is never
lent again: reusing one too early would turn into wrong tokens, so the test errs only towards
allocating.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

# Idle buffers kept beyond as many as are in use: slack for the frames in flight.
SPARE = 4
# Buffers are allocated in whole steps, so frames of nearly equal size share them.
STEP = 64 << 10


def _references(buffers: list, i: int) -> int:
    return sys.getrefcount(buffers[i])


class FramePool:
    """Lends writable uint8 arrays for decoded frames; see the module docstring. Thread-safe:
    a decode-ahead helper and its owner may both take."""

    def __init__(self, spare: int = SPARE):
        self.spare = spare
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()
        probe = [np.empty(1, dtype=np.uint8)]
        self._unused = _references(probe, 0)  # the count of a buffer only the pool holds
        self.allocated = 0  # buffers made, for tests and benchmarks
        self._peak = 0  # the most buffers in use at once

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of `nbytes` whose memory nothing else views."""
        with self._lock:
            buffers, unused = self._buffers, self._unused
            chosen = -1
            idle: list[int] = []
            for i in range(len(buffers)):
                if _references(buffers, i) == unused:
                    idle.append(i)
                    if chosen < 0 and len(buffers[i]) >= nbytes:
                        chosen = i
            if chosen < 0:
                buffers.append(np.empty(-(-max(nbytes, 1) // STEP) * STEP, dtype=np.uint8))
                chosen = len(buffers) - 1
                self.allocated += 1
            else:
                idle.remove(chosen)
            lent = buffers[chosen][:nbytes]
            # Idle buffers are kept up to the most ever in use at once plus `spare` (what the
            # stream needed at its peak, and will again as its shuffle buffer refills); only
            # beyond that is memory given back.
            in_use = len(buffers) - len(idle)
            self._peak = max(self._peak, in_use)
            keep = self.spare + self._peak - in_use
            for i in reversed(idle[keep:]):
                del buffers[i]
            return lent

    def __len__(self) -> int:
        """Buffers held, lent or idle."""
        return len(self._buffers)
