"""Process liveness, shared by the storage cache, the shared-memory batch transport and the
loader workers' watchdog."""

from __future__ import annotations

import os


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
