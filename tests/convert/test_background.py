"""The worker's background writer: jobs run in order, a job's error reaches the submitter and
stops the jobs after it, and leaving the block waits for every job."""

from __future__ import annotations

import threading
import time

import pytest

from shardtok.convert.worker.background import BackgroundWriter


def test_jobs_run_in_order_on_another_thread_and_close_waits_for_them():
    done, threads = [], set()

    def job(i):
        time.sleep(0.001 * (i % 3))
        threads.add(threading.get_ident())
        done.append(i)

    with BackgroundWriter(depth=2) as sink:
        for i in range(20):
            sink.submit(lambda i=i: job(i))
    assert done == list(range(20))
    assert threads and threading.get_ident() not in threads


def test_a_failing_job_is_raised_once_and_the_jobs_after_it_are_skipped():
    done = []

    def fail():
        raise OSError("disk full")

    sink = BackgroundWriter()
    sink.submit(lambda: done.append(1))
    sink.submit(fail)
    sink.submit(lambda: done.append(2))
    with pytest.raises(OSError, match="disk full"):
        sink.close()
    assert done == [1]
    sink.close()  # already reported: closing again is quiet


def test_submit_raises_a_failure_that_already_happened():
    sink = BackgroundWriter()
    sink.submit(lambda: 1 / 0)
    _submit_until_it_raises(sink)
    sink.close()


def test_an_exception_leaving_the_block_wins_over_a_job_failure():
    with pytest.raises(KeyError), BackgroundWriter() as sink:
        sink.submit(lambda: 1 / 0)
        raise KeyError("the caller's own")


def test_drain_waits_for_the_jobs_so_far_and_the_writer_goes_on_after_a_failure():
    done = []
    sink = BackgroundWriter(depth=4)
    sink.submit(lambda: (time.sleep(0.01), done.append(1)))
    sink.drain()
    assert done == [1]

    sink.submit(lambda: 1 / 0)
    sink.submit(lambda: done.append("skipped"))
    with pytest.raises(ZeroDivisionError):
        sink.drain()
    sink.submit(lambda: done.append(2))  # a worker's next unit
    sink.drain()
    assert done == [1, 2]
    sink.close()


def test_drain_does_not_raise_again_a_failure_submit_raised():
    sink = BackgroundWriter()
    sink.submit(lambda: 1 / 0)
    _submit_until_it_raises(sink)
    sink.drain()  # reported once, by submit
    sink.close()


def _submit_until_it_raises(sink: BackgroundWriter) -> None:
    """Submit no-ops until the writer reports the failing job (within 10 s)."""
    deadline = time.monotonic() + 10
    with pytest.raises(ZeroDivisionError):
        while time.monotonic() < deadline:
            sink.submit(lambda: None)
            time.sleep(0.001)


# -- units: conclude ---------------------------------------------------------------------------


def test_a_units_conclusion_gets_its_own_failure_and_the_next_unit_runs_clean():
    done, verdicts = [], []
    sink = BackgroundWriter(depth=4)
    sink.submit(lambda: 1 / 0)
    sink.submit(lambda: done.append("skipped"))  # the same unit: skipped
    sink.conclude(lambda error: verdicts.append(type(error).__name__))
    sink.submit(lambda: done.append("next unit"))  # never raises the last unit's failure
    sink.conclude(verdicts.append)
    sink.drain()
    assert done == ["next unit"]
    assert verdicts == ["ZeroDivisionError", None]
    sink.close()


def test_a_failure_raised_by_submit_is_not_handed_to_the_conclusion_again():
    verdicts = []
    sink = BackgroundWriter()
    sink.submit(lambda: 1 / 0)
    _submit_until_it_raises(sink)
    sink.conclude(verdicts.append)
    sink.drain()
    assert verdicts == [None]
    sink.close()


def test_a_failing_conclusion_skips_nothing_and_is_raised_by_close():
    done = []

    def broken(error):
        raise OSError("cannot send")

    sink = BackgroundWriter()
    sink.conclude(broken)
    sink.submit(lambda: done.append("next unit"))
    sink.conclude(lambda error: done.append(error))
    with pytest.raises(OSError, match="cannot send"):
        sink.close()
    assert done == ["next unit", None]


def test_conclude_does_not_wait_for_the_thread():
    gate = threading.Event()
    sink = BackgroundWriter(depth=4)
    sink.submit(gate.wait)
    sink.conclude(lambda error: None)  # returns although the unit's first job still waits
    gate.set()
    sink.close()
