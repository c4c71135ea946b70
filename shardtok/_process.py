"""Processes: liveness (shared by the storage cache, the shared-memory batch transport and the
loader workers' watchdog), and the cores, start method and Ctrl-C rule of conversion workers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys


def process_alive(pid: int) -> bool:
    """Whether `pid` exists (owned by anyone) and has not exited: signal 0 checks without
    delivering anything."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # A process that exited but is not yet reaped by its parent (a zombie: a SIGKILLed trainer
    # whose launcher is still busy) still takes signal 0, and holds nothing any more.
    return not _exited(pid)


def _exited(pid: int) -> bool:
    """A zombie, or reaped since signal 0 found it; False where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name, in parentheses, may itself hold spaces and parentheses.
            return f.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except FileNotFoundError:
        return os.path.isdir("/proc/self")
    except OSError:
        return False


def usable_cores() -> int:
    """Cores this process may use (a container's CPU set, not the host's core count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def mp_context(start_method: str | None):
    """fork where it is safe and cheap (Linux), spawn elsewhere (macOS, Windows)."""
    if start_method is not None:
        return multiprocessing.get_context(start_method)
    if sys.platform == "linux":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def ignore_sigint() -> None:
    """A convert worker's first act. Ctrl-C reaches the whole process group: the main process
    alone answers it (one line) and ends the pool, so no worker prints a traceback of its own.
    The unit pool starts workers with SIGINT blocked (shardtok.convert.engines.pool._sigint_held): one that came since is
    dropped once ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
