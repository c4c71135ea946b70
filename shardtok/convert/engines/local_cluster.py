"""A loopback dask LocalCluster in a process of its own, for ``--engine dask`` without a scheduler.

Why not in the caller's process: a LocalCluster's nannies write variables into the environment
of the process that starts them (OMP_NUM_THREADS, MALLOC_TRIM_THRESHOLD_, PYTHONHASHSEED...: how
they hand them to the workers they spawn, again on each restart), and shardtok changes no
environment variable of its caller's. Here they land in this helper process, which lives exactly
as long as its stdin: the driver holds the write end and closes it when done, and a driver
killed any way closes it too, so the cluster never outlives the conversion.

    python -m shardtok.convert.engines.local_cluster N    # prints the scheduler's address, one line
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from shardtok.errors import ShardtokError


@contextlib.contextmanager
def local_cluster(workers: int) -> Iterator[str]:
    """Start the helper with `workers` worker processes; yields its scheduler address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, str(workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = proc.stdout.readline().strip()
        if not address.startswith("tcp://"):
            proc.stdin.close()
            detail = proc.stderr.read().strip().splitlines()
            raise ShardtokError(
                "could not start a local dask cluster"
                + (f": {detail[-1]}" if detail else f" (exit status {proc.wait()})")
            )
        yield address
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _serve(workers: int) -> None:
    import distributed

    with distributed.LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        # The scheduler's HTTP server runs even without a dashboard, by default on every
        # interface at port 8787: loopback, any free port instead.
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
    ) as cluster:
        print(cluster.scheduler_address, flush=True)
        sys.stdin.read()  # until the driver closes its end, or dies


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
