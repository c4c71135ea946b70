"""The units a one-command convert tokenizes, sent to its pool in order, a window ahead, each with
its canary verdict (canary.py) checked in this process just before it is sent.

A window, not every unit at once: a verdict costs this process ~0.4 ms per 256 KiB unit (~25 ms
per 16 MiB one), which for a large job must not all come before the first unit is assembled.
The window holds 64 MiB of input per worker (at least 4 units): far more work than a worker
does while this process writes a shard, so workers never wait for units.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future

from shardtok.convert.inputs.units import Unit
from shardtok.convert.tokenizing.canary import UnitCanary

_WINDOW_BYTES = 64 << 20
_WINDOW_UNITS = 4


class UnitFeed:
    """`pending` maps each sent unit's Future to its index until the caller pops it."""

    def __init__(self, pool, todo: Iterable[Unit], canary: UnitCanary | None, workers: int):
        self.pool = pool
        self.todo = list(todo)
        self.sent = 0
        self.canary = canary
        largest = max((u.nbytes for u in self.todo), default=1) or 1
        self.window = workers * max(_WINDOW_UNITS, _WINDOW_BYTES // largest)
        self.pending: dict[Future, int] = {}
        self.stopped = False

    def top_up(self) -> None:
        """Send units until the window is full (none after :meth:`stop_after`)."""
        while not self.stopped and self.sent < len(self.todo) and len(self.pending) < self.window:
            unit = self.todo[self.sent]
            self.sent += 1
            checked = self.canary.check(unit) if self.canary is not None else None
            self.pending[self.pool.submit(unit, checked)] = unit.index

    def stop_after(self, index: int) -> None:
        """Unit `index` stops the run: the units after it are wasted work, so those not sent
        stay unsent and those queued in the pool are cancelled."""
        self.stopped = True
        for other in [f for f, i in self.pending.items() if i > index]:
            if other.cancel():
                del self.pending[other]

    @property
    def all_in(self) -> bool:
        """Every unit that will be tokenized is back (or cancelled)."""
        return not self.pending and (self.stopped or self.sent == len(self.todo))
