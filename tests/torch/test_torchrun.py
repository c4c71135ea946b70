"""Proof under torchrun (2 processes, gloo, CPU) over a dataset with very uneven shards.

Both ranks run the same number of steps with an all_reduce each step (a mismatch would hang and
time out), their batches are disjoint and together cover the epoch. Then a job is killed with
SIGKILL after it saved its state at step k, restarted from that state, and the batches of the
killed run before k plus the restarted run equal the uninterrupted run, rank by rank.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.format.manifest import Manifest
from shardtok.stream.build import plan_for
from shardtok.stream.options import StreamOptions
from shardtok.testing.synthetic import write_synthetic_dataset

HERE = Path(__file__).parent
WORKER = HERE.parent / "helpers" / "torchrun_worker.py"
VOCAB = 1 << 24
SAVE_AT = 9


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """Token id = global position; shards from ~300 to ~40,000 tokens."""
    path = tmp_path_factory.mktemp("uneven_run")
    rng = np.random.default_rng(4)
    lengths = [int(n) for n in rng.integers(1, 120, size=260)]
    lengths[30], lengths[200] = 2500, 4000
    entries, at, part_manifest = [], 0, None
    for part, (count, shard_size) in enumerate(((90, 300), (100, 40_000), (70, 1500))):
        part_manifest = write_synthetic_dataset(
            path, lengths=lengths[at : at + count], vocab_size=VOCAB, unique_tokens=True,
            shard_size=shard_size, frame_size=700, name=f"part{part}",
            first_token=sum(lengths[:at]),
        )  # fmt: skip
        entries += part_manifest.shards
        at += count
    assert part_manifest is not None
    manifest = Manifest(
        "uneven", part_manifest.dtype, VOCAB, part_manifest.tokenizer, tuple(entries)
    )
    manifest.write(path)
    sizes = [s.num_tokens for s in entries]
    assert max(sizes) > 20 * min(sizes)
    return path, sum(lengths)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(dataset: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(WORKER), str(dataset), str(out), *extra,
    ]  # fmt: skip


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parents[1]), env.get("PYTHONPATH")]))
    return env


def run_job(dataset: Path, out: Path, *extra: str) -> None:
    out.mkdir(exist_ok=True)
    done = subprocess.run(
        torchrun_command(dataset, out, *extra), env=environment(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def steps(out: Path, rank: int) -> dict[int, np.ndarray]:
    found = {}
    for f in out.glob(f"rank{rank}_step*.npy"):
        found[int(f.stem.split("step")[1])] = np.load(f)
    return found


def test_two_ranks_equal_steps_disjoint_cover_and_kill_resume(uneven, tmp_path):
    dataset, total = uneven
    full = tmp_path / "full"
    run_job(dataset, full)
    counts = [int((full / f"rank{r}_done").read_text()) for r in (0, 1)]
    plan = plan_for(
        DatasetSource(dataset), StreamOptions(seq_len=31, batch_size=2, packing="concat",
                                              shuffle_buffer=16, seed=7),
        epoch=0, world_size=2, num_workers=1,
    )  # fmt: skip
    assert counts[0] == counts[1] == plan.batches_per_rank > SAVE_AT + 3
    per_rank = [steps(full, r) for r in (0, 1)]
    assert all(sorted(s) == list(range(counts[0])) for s in per_rank)
    tokens = [np.concatenate([a.ravel() for a in s.values()]) for s in per_rank]
    assert not set(tokens[0].tolist()) & set(tokens[1].tolist())  # disjoint ranks
    everything = np.concatenate(tokens)
    assert len(np.unique(everything)) == len(everything)  # no token twice
    assert len(everything) == total - plan.tokens_unread  # the whole epoch, less the report

    killed = tmp_path / "killed"
    killed.mkdir()
    job = subprocess.Popen(
        torchrun_command(dataset, killed, "--save-at", str(SAVE_AT), "--stall"),
        env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not all((killed / f"state_rank{r}.pt").exists() for r in (0, 1)):
            assert job.poll() is None, "the job ended before saving its state"
            assert time.monotonic() < deadline, "no state saved in time"
            time.sleep(0.1)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL
    run_job(dataset, killed, "--resume")
    for r in (0, 1):
        resumed = steps(killed, r)
        assert sorted(resumed) == list(range(counts[r])), f"rank {r} steps"
        for s, want in per_rank[r].items():
            assert np.array_equal(resumed[s], want), f"rank {r} step {s}"
