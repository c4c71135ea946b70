"""UnitFeed: units go to the pool in order a window ahead, each with its canary verdict, and
none after a unit that stops the run."""

from __future__ import annotations

from concurrent.futures import Future

from shardtok.convert.engines.unit_feed import UnitFeed
from shardtok.convert.inputs.units import InputRange, Unit

MiB = 1 << 20


class _Pool:
    def __init__(self):
        self.sent: list[tuple[int, object]] = []

    def submit(self, unit, checked=None) -> Future:
        self.sent.append((unit.index, checked))
        return Future()


class _Canary:
    def check(self, unit):
        return f"verdict {unit.index}"


def _units(n: int, nbytes: int) -> list[Unit]:
    return [Unit(i, (InputRange(0, i * nbytes, (i + 1) * nbytes),), nbytes) for i in range(n)]


def _finish(feed: UnitFeed, index: int) -> None:
    future = next(f for f, i in feed.pending.items() if i == index)
    future.set_result(None)
    del feed.pending[future]


def test_a_window_of_64_mib_per_worker_and_at_least_4_units():
    pool = _Pool()
    feed = UnitFeed(pool, _units(300, 1 * MiB), _Canary(), workers=2)
    feed.top_up()
    assert [i for i, _ in pool.sent] == list(range(128))  # 2 workers x 64 MiB
    assert pool.sent[5] == (5, "verdict 5")
    _finish(feed, 0)
    _finish(feed, 1)
    feed.top_up()
    assert [i for i, _ in pool.sent[128:]] == [128, 129]
    big = UnitFeed(_Pool(), _units(20, 32 * MiB), None, workers=3)
    big.top_up()
    assert [i for i, _ in big.pool.sent] == list(range(12)) and big.pool.sent[0][1] is None


def test_nothing_is_sent_after_a_unit_that_stops_the_run():
    pool = _Pool()
    feed = UnitFeed(pool, _units(10, 32 * MiB), None, workers=1)
    feed.top_up()
    assert len(pool.sent) == 4 and not feed.all_in
    feed.stop_after(1)  # units 2 and 3 were only queued: cancelled
    assert sorted(feed.pending.values()) == [0, 1]
    feed.top_up()
    assert len(pool.sent) == 4
    _finish(feed, 0)
    _finish(feed, 1)
    assert feed.all_in


def test_all_in_once_every_unit_is_back():
    feed = UnitFeed(_Pool(), _units(3, 1 * MiB), None, workers=1)
    feed.top_up()
    for index in range(3):
        assert not feed.all_in
        _finish(feed, index)
    assert feed.all_in
    assert UnitFeed(None, [], None, workers=1).all_in
