"""Kill a process that has workers, and watch the workers it leaves behind. Two modes:

``orphan_harness.py START_METHOD INPUT OUTPUT``: start a conversion, SIGKILL it as soon as its
first worker exists, wait for every process it left behind to exit. Exit 0 when none is left
within the bound, 1 (naming them) when some are still alive; the bound is generous, the test
never asserts how long it took.

``orphan_harness.py loader DATASET METHOD:SIGNAL...``: per case, a trainer holding a
``ShardLoader`` with two workers under that start method, killed with that signal right after
a first batch from each worker (see ``loader_main``). Prints one JSON line per case: the
workers' pids, when each exited after the trainer died, and any still alive after the bound
(then killed).

This process makes itself a child subreaper (Linux), so the orphans are re-parented to it and
can be watched (and reaped) here rather than vanishing under init.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_BOUND_S = 30.0

CONVERT = """
import sys
from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
convert(ConvertJob(inputs=(sys.argv[2],), output=sys.argv[3], tokenizer=load_tokenizer("bundled"),
                   unit_size=16384),
        RunOptions(workers=3, progress=False, start_method=sys.argv[1]))
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


# -- ShardLoader: a trainer per (start method, signal) ------------------------------------------


def _trainer(dataset: str, method: str, report: int) -> None:
    from shardtok.torch import ShardLoader, ShardStreamDataset

    # A training script's own Ctrl-C handling, whatever this harness inherited (a suite started
    # in the background by a non-interactive shell ignores SIGINT, and so would its children).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ds = ShardStreamDataset(dataset, seq_len=63, batch_size=4)
    loader = ShardLoader(ds, num_workers=2, multiprocessing_context=method)
    batches = iter(loader)
    # One batch from each worker (they take turns): a spawned worker still importing torch when
    # its trainer dies cannot notice before its start-up ends, seconds later on a loaded machine.
    for _ in range(loader.num_workers):
        next(batches)
    os.write(report, json.dumps([p.pid for p in loader._workers.processes]).encode() + b"\n")
    time.sleep(_BOUND_S * 10)  # holding `batches` (its workers ahead, waiting for credit)


def _start_trainer(dataset: str, method: str) -> tuple[int, int]:
    """A forked trainer (torch already imported: its start costs nothing) and the read end of
    the pipe it writes its workers' pids on."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    os.close(read)
    code = 0
    try:
        _trainer(dataset, method, write)
    except KeyboardInterrupt:  # SIGINT: Python's own handler, then the exit handlers below
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 3
    atexit._run_exitfuncs()  # what the interpreter runs on its way out (multiprocessing's)
    os._exit(code)


def _exited(pid: int) -> bool:
    stat = _stat(pid)
    return stat is None or stat[1] == "Z"


def loader_main(dataset: str, cases: list[str]) -> int:
    """Each case's trainer is signalled as soon as it reports its workers, and is left unreaped
    (a zombie, as under a launcher that has not waited yet) until its workers are gone: they must
    not take a zombie for a live main process. Times are taken by polling every 10 ms."""
    # The script's own imports, as in a training job: the fork server starts with them and its
    # workers do not import torch again (spawned ones still do).
    import shardtok.torch  # noqa: F401

    multiprocessing.set_forkserver_preload(["shardtok.torch"])
    running = {}
    for case in cases:
        method, name = case.split(":")
        pid, report = _start_trainer(dataset, method)
        running[report] = {"method": method, "signal": name, "trainer": pid, "line": b""}
    ready_by = time.monotonic() + _BOUND_S * 4
    watched, results = [], []
    while running or watched:
        if running:
            ready = select.select(list(running), [], [], 0.01)[0]
        else:
            ready = []
            time.sleep(0.01)
        now = time.monotonic()
        for fd in ready:
            case = running[fd]
            chunk = os.read(fd, 4096)
            case["line"] += chunk
            if chunk and not case["line"].endswith(b"\n"):
                continue
            del running[fd]
            os.close(fd)
            if not chunk:
                case["error"] = "the trainer exited before its first batches"
                os.waitpid(case["trainer"], 0)
                results.append(case)
                continue
            case["workers"] = json.loads(case.pop("line"))
            os.kill(case["trainer"], getattr(signal, case["signal"]))
            case.update(signalled=now, died=None, exits={})
            watched.append(case)
        for case in list(watched):
            if case["died"] is None and _exited(case["trainer"]):
                case["died"] = now
            for worker in case["workers"]:
                if worker not in case["exits"] and _exited(worker):
                    case["exits"][worker] = now
                with contextlib.suppress(ChildProcessError):  # an orphan now ours: reap it
                    os.waitpid(worker, os.WNOHANG)
            left = [w for w in case["workers"] if w not in case["exits"]]
            over = now - case["signalled"] > _BOUND_S
            if case["died"] is not None and (not left or over):
                for worker in left:
                    os.kill(worker, signal.SIGKILL)
                os.waitpid(case["trainer"], 0)
                watched.remove(case)
                results.append(case | {"left": left})
        if running and now > ready_by:
            for case in running.values():
                os.kill(case["trainer"], signal.SIGKILL)
                os.waitpid(case["trainer"], 0)
                results.append(case | {"error": "no first batches within the bound"})
            running = {}
    for case in results:
        if "error" not in case:
            case["after_death_s"] = {w: t - case["died"] for w, t in case.pop("exits").items()}
            case["death_after_signal_s"] = case.pop("died") - case.pop("signalled")
        case.pop("line", None)
        print(json.dumps(case), flush=True)
    # What else the trainers left (fork servers, resource trackers) goes once they see the
    # trainers gone; not part of the cases' verdicts.
    deadline = time.monotonic() + _BOUND_S
    while _descendants(os.getpid()) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.05)
    for pid in _descendants(os.getpid()):
        print(f"left behind: {pid} {_cmdline(pid)}", file=sys.stderr)
        os.kill(pid, signal.SIGKILL)
    _reap()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["loader"]:
        if ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            sys.exit("cannot become a child subreaper")
        sys.exit(loader_main(sys.argv[2], sys.argv[3:]))
    sys.exit(main())
