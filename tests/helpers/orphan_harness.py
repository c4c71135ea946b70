"""Start a conversion, SIGKILL it as soon as its first worker exists, wait for every process it
left behind to exit. Run as a script: ``orphan_harness.py START_METHOD INPUT OUTPUT``.

This process makes itself a child subreaper (Linux), so the orphans are re-parented to it and
can be watched (and reaped) here rather than vanishing under init. Exit 0 when none is left
within the bound, 1 (naming them) when some are still alive; the bound is generous, the test
never asserts how long it took.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_BOUND_S = 30.0

CONVERT = """
import sys
from shardtok.convert import ConvertOptions, convert, load_tokenizer
convert(ConvertOptions(inputs=(sys.argv[2],), output=sys.argv[3], tokenizer=load_tokenizer("bundled"),
                       workers=3, unit_size=16384, progress=False, start_method=sys.argv[1]))
"""


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return found


def _descendants(root: int) -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process below `root`."""
    if os.path.exists(f"/proc/{root}/task/{root}/children"):  # cheap: no /proc scan
        found, frontier = {}, [root]
        while frontier:
            parent = frontier.pop()
            for pid in _children(parent):
                stat = _stat(pid)
                if stat is not None and stat[1] != "Z" and pid not in found:
                    found[pid] = parent
                    frontier.append(pid)
        return found
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] != "Z":
                parents[int(entry)] = stat[0]
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = ppid
                frontier.append(pid)
    return found


def _workers(main: int, below: dict[int, int]) -> list[int]:
    """Descendants that tokenize: not the resource tracker, not the fork server itself."""
    return [
        pid
        for pid, ppid in below.items()
        if "resource_tracker" not in _cmdline(pid)
        and not (ppid == main and "forkserver" in _cmdline(pid))
    ]


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> int:
    start_method, source, output = sys.argv[1:4]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cannot become a child subreaper", file=sys.stderr)
        return 2
    child = subprocess.Popen([sys.executable, "-c", CONVERT, start_method, source, output])
    deadline = time.monotonic() + _BOUND_S
    while not _workers(child.pid, _descendants(child.pid)):
        if child.poll() is not None or time.monotonic() > deadline:
            print(f"no worker seen (convert exited {child.poll()})", file=sys.stderr)
            return 2
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + _BOUND_S
    while True:
        _reap()
        left = _descendants(os.getpid())
        if not left:
            return 0
        if time.monotonic() > deadline:
            for pid in left:
                print(f"still alive: {pid} {_cmdline(pid)}", file=sys.stderr)
                os.kill(pid, signal.SIGKILL)
            return 1
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
