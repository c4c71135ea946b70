"""`convert merge`'s shard writers ignore Ctrl-C: the main process alone answers it (one line,
exit 130), under every start method, so no writer prints a traceback of its own."""

from __future__ import annotations

import os
import signal

import pytest

from shardtok.convert.job.merge import _LocalMap


def _interrupted_then(value: int) -> int:
    # What a terminal's Ctrl-C does to every process of its group, this one included.
    os.kill(os.getpid(), signal.SIGINT)
    return value * 2


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_merge_workers_carry_on_through_a_ctrl_c(method):
    tasks = _LocalMap(2, method)
    try:
        assert tasks(_interrupted_then, [1, 2, 3, 4]) == [2, 4, 6, 8]
    finally:
        tasks.close()
