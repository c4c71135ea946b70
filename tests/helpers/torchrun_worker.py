"""One rank of test_torchrun.py, launched by torchrun (gloo on CPU).

Every step all-reduces a counter (a rank with fewer batches would hang the others, and the
process-group timeout turns that into a failure), writes its batch to OUT/rank{r}_step{s}.npy,
and after step `--save-at` writes its loader state to OUT/state_rank{r}.pt, then (with
`--stall`) waits to be killed. `--resume` restores that state and continues.

Usage: torchrun --nproc-per-node 2 torchrun_worker.py DATASET OUT [--save-at K --stall] [--resume]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from shardtok.torch import ShardStreamDataset

warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


def die_with_torchrun() -> None:
    """torchrun starts each rank in a session of its own, so killing torchrun's process group
    (as the test does) would leave the ranks waiting on gloo for ever: end with the parent."""
    import ctypes
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def main() -> None:
    die_with_torchrun()
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("out")
    p.add_argument("--save-at", type=int)
    p.add_argument("--stall", action="store_true")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    out = Path(args.out)
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = ShardStreamDataset(
        args.dataset, seq_len=31, batch_size=2, packing="concat", shuffle_buffer=16, seed=7
    )
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=1)
    step = 0
    if args.resume:
        saved = torch.load(out / f"state_rank{rank}.pt", weights_only=False)
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
    for batch in loader:
        tokens = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)
        np.save(out / f"rank{rank}_step{step}.npy", tokens.numpy())
        counter = torch.ones(1)
        dist.all_reduce(counter)  # hangs (then times out) if the ranks' batch counts differ
        assert int(counter.item()) == dist.get_world_size()
        step += 1
        if args.save_at is not None and step == args.save_at:
            state = {"loader": loader.state_dict(), "step": step}
            tmp = out / f"state_rank{rank}.pt.tmp"
            torch.save(state, tmp)
            os.replace(tmp, out / f"state_rank{rank}.pt")
            dist.barrier()
            while args.stall:  # the test kills the job here
                time.sleep(0.1)
    (out / f"rank{rank}_done").write_text(str(step))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
