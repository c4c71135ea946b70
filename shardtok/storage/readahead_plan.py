"""How far a remote stream reads ahead: the link's latency and bandwidth as measured, and the
window of bytes they call for.

A stream keeps requested, ahead of what its reader has consumed, ``window_bytes(...)`` bytes:
the block being read, the next one, and the link's bandwidth-delay product (bandwidth x latency:
what arrives during one round trip), so that a new request's round trip is covered by bytes
already on their way. More latency or more bandwidth means more ranged GETs in flight; never
more than the memory cap (``RetryPolicy.read_ahead_bytes``), never less than one first block.

Measurements are per process and per endpoint (``link_of``): each completed request adds its
time to first byte (latency) and its body rate (bandwidth) to smoothed averages, as TCP smooths
round-trip times. The latency used is a high estimate (mean plus twice the mean deviation), so
that jitter (20-50 ms, say) is covered rather than averaged away.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from shardtok.storage.base import FIRST_BLOCK_SIZE

GAIN = 1 / 8  # weight of a new sample in the smoothed averages (TCP's SRTT gain)
MIN_RATE_SAMPLE = 256 << 10  # bodies smaller than this say little about bandwidth


def window_bytes(latency: float | None, bandwidth: float | None, block_size: int, cap: int) -> int:
    """Bytes one stream keeps requested ahead of its reader (in flight, or arrived and unread,
    the block being read included).

    ``2 * block_size + bandwidth * latency``: the block being read, the next one arriving, and
    the bandwidth-delay product behind them, so that the link stays busy while each new request
    waits for its first byte. Without measurements yet (None): the two blocks. Bounded by
    ``cap``, and at least one first block (a smaller cap still lets a request of its size by).
    """
    bdp = 0.0 if latency is None or bandwidth is None else max(latency, 0.0) * max(bandwidth, 0.0)
    want = 2 * block_size + int(bdp)
    return max(min(want, cap), min(FIRST_BLOCK_SIZE, cap))


def next_request_size(previous: int | None, block_size: int, window: int) -> int:
    """The size of a stream's next ranged GET: a small first block (the head of a shard arrives
    after one small request, so the first batch is quick), then doubling up to the block size;
    never more than half the window, so that two requests can overlap."""
    size = FIRST_BLOCK_SIZE if previous is None else 2 * previous
    return max(1, min(size, block_size, max(window // 2, 1)))


@dataclass(frozen=True)
class LinkSample:
    latency: float  # seconds from sending a request to its first body byte
    bandwidth: float | None  # body bytes per second after the first one; None: too small to say


class LinkEstimate:
    """Smoothed latency (mean and mean deviation) and bandwidth of one endpoint, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latency: float | None = None  # smoothed mean
        self.deviation = 0.0  # smoothed mean deviation of the latency
        self.bandwidth: float | None = None
        self.samples = 0

    def observe(self, sample: LinkSample) -> None:
        with self._lock:
            self.samples += 1
            if self.latency is None:
                self.latency, self.deviation = sample.latency, sample.latency / 2
            else:
                error = sample.latency - self.latency
                self.latency += GAIN * error
                self.deviation += GAIN * (abs(error) - self.deviation)
            if sample.bandwidth is not None:
                if self.bandwidth is None:
                    self.bandwidth = sample.bandwidth
                else:
                    self.bandwidth += GAIN * (sample.bandwidth - self.bandwidth)

    def high_latency(self) -> float | None:
        """Mean plus twice the deviation: a round trip rarely takes longer (None: unmeasured)."""
        with self._lock:
            return None if self.latency is None else self.latency + 2 * self.deviation

    def window(self, block_size: int, cap: int) -> int:
        """``window_bytes`` for this link as measured so far."""
        latency = self.high_latency()
        with self._lock:
            bandwidth = self.bandwidth
        return window_bytes(latency, bandwidth, block_size, cap)

    def copy(self) -> LinkEstimate:
        """A new estimate that starts from this one's figures (its own lock)."""
        other = LinkEstimate()
        other.latency, other.deviation = self.latency, self.deviation
        other.bandwidth, other.samples = self.bandwidth, self.samples
        return other


def sample_of(sent: float, first_byte: float | None, done: float, size: int) -> LinkSample | None:
    """What one complete request says about the link (monotonic times); None if no body came."""
    if first_byte is None or size <= 0:
        return None
    rest = done - first_byte
    bandwidth = size / rest if size >= MIN_RATE_SAMPLE and rest > 0 else None
    return LinkSample(max(first_byte - sent, 0.0), bandwidth)


_links: dict[tuple, LinkEstimate] = {}  # (process id, endpoint) -> estimate
_links_lock = threading.Lock()


def link_of(endpoint: tuple) -> LinkEstimate:
    """The process's estimate for `endpoint`. A forked worker starts from its parent's figures
    (the same link) with a lock of its own: one held at the fork would never be released."""
    key = (os.getpid(), endpoint)
    link = _links.get(key)
    if link is None:
        with _links_lock:
            link = _links.get(key)
            if link is None:
                parent = next((v for (_, e), v in _links.items() if e == endpoint), None)
                link = _links[key] = LinkEstimate() if parent is None else parent.copy()
    return link
