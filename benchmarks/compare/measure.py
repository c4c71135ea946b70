"""Measurements taken from outside the measured process: memory of a process tree, disk usage, the machine.

Memory comes from /proc/PID/smaps_rollup of every process in the tree (the benchmark process and
its DataLoader workers), summed per sample; the peak of each sum is reported:
- RSS: resident pages, shared ones counted once per process that maps them (what `top` adds up);
- USS: pages private to one process (Private_Clean + Private_Dirty), what killing it would free;
- anon: anonymous pages only. Memory-mapped file pages count in RSS and, when one process maps
  them, in USS, although the kernel can drop them at any time; anon shows the part it cannot.
"""

from __future__ import annotations

import os
import platform
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

_FIELDS = {"Rss:": "rss", "Private_Clean:": "uss", "Private_Dirty:": "uss", "Anonymous:": "anon"}


def _parent_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name is in parentheses and may contain spaces; the ppid follows the last ')'
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def process_tree(root: int) -> list[int]:
    """root and all its descendants alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _parent_of(entry)
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(root: int) -> dict[int, float]:
    """User + system CPU seconds of each process in root's tree, alive now."""
    out = {}
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return out


def memory_of(pid: int) -> dict[str, int] | None:
    """rss/uss/anon of one process in bytes, or None when it is gone."""
    totals = {"rss": 0, "uss": 0, "anon": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(" ")
                name = _FIELDS.get(key)
                if name:
                    totals[name] += int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return totals


@dataclass
class TreeMemory:
    """Samples the memory of a process tree in a background thread until stopped."""

    root: int
    interval: float = 0.1
    peak: dict[str, int] = field(default_factory=lambda: {"rss": 0, "uss": 0, "anon": 0})
    max_processes: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        totals = {"rss": 0, "uss": 0, "anon": 0}
        pids = process_tree(self.root)
        for pid in pids:
            one = memory_of(pid)
            if one:
                for key, value in one.items():
                    totals[key] += value
        for key, value in totals.items():
            self.peak[key] = max(self.peak[key], value)
        self.max_processes = max(self.max_processes, len(pids))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def as_dict(self) -> dict:
        return {
            **{f"peak_{k}": v for k, v in self.peak.items()},
            "max_processes": self.max_processes,
            "samples": self.samples,
        }


def disk_usage(path: Path) -> int:
    """Bytes of all regular files under path (what the format costs on disk)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def machine() -> dict:
    """CPU model, cores, RAM, kernel and Python, for the results header."""
    model = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    mem_total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "ram_bytes": mem_total,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
