"""The scripts in examples/ run end to end, as a user runs them: each in a child process, in a
temporary folder, on data it makes with the CLI (small, so each takes seconds on a CPU). Each
script asserts its own claim (the loss falls and packed documents stay isolated; a resume is
bit-exact; DDP ranks get different batches), so a passing run is the check."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.examples  # .ci/run runs them after the default suite (--examples)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run(args: list[str], cwd: Path, timeout: float = 120) -> str:
    """Run `args`, return its output; on a timeout end the whole process group (torchrun's
    ranks included) rather than leaving it behind."""
    job = subprocess.Popen(
        args, cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGTERM)  # torchrun passes SIGTERM on to its ranks
        try:
            out, _ = job.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            out, _ = job.communicate()
        pytest.fail(f"{args} ran over {timeout} s:\n{out[-4000:]}")
    assert job.returncode == 0, out[-6000:]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory) -> Path:
    """A folder whose shards/ both pretraining examples use (train_loop_resume.py finds
    OUT/shards made and skips making it again): converted once, not twice."""
    out = tmp_path_factory.mktemp("pretraining")
    run([sys.executable, str(EXAMPLES / "torchrun_ddp.py"), str(out / "shards"), "--make-data",
         "--corpus-bytes", "200000"], cwd=out)  # fmt: skip
    return out


def test_hf_trainer_sft(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    out = run([sys.executable, str(EXAMPLES / "hf_trainer_sft.py"), "--out", str(tmp_path)],
              cwd=tmp_path)  # fmt: skip
    assert "packed documents match their logits alone" in out


def test_train_loop_resume(pretraining, tmp_path):
    out = run([sys.executable, str(EXAMPLES / "train_loop_resume.py"), "--out", str(pretraining),
               "--steps", "10", "--save-at", "4"], cwd=tmp_path)  # fmt: skip
    assert "resume exact" in out


def test_torchrun_ddp(pretraining, tmp_path):
    out = run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(EXAMPLES / "torchrun_ddp.py"), str(pretraining / "shards"), "--steps", "4"],
        cwd=tmp_path,
    )  # fmt: skip
    assert "different batches, equal weights" in out
