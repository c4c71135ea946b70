"""Data-parallel training under ``torchrun`` (CPU, gloo): every rank streams its own batches.

Shows: once ``torch.distributed`` is initialised, ``ShardStreamDataset`` takes its rank and
world size from it, so the same line on every rank gives each rank a disjoint share of the
epoch, with the same number of batches on every rank (no rank waits for ever on a collective
the others never reach). A tiny model wrapped in ``DistributedDataParallel`` trains a few
steps from ``ShardLoader(ds, num_workers=1)``; the script asserts that the ranks' first
batches differ and that DDP kept their weights equal.

Run (from the repository root):

    python examples/torchrun_ddp.py --make-data /tmp/ddp-example/shards     # once
    torchrun --nproc-per-node 2 examples/torchrun_ddp.py /tmp/ddp-example/shards

On GPUs the same script works with the "nccl" backend and the model and batch moved to
``cuda:LOCAL_RANK`` (see ``to_device``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardtok.torch import ShardLoader, ShardStreamDataset

SEQ_LEN = 128
BATCH = 4


def make_data(shards: Path, corpus_bytes: int) -> None:
    shards.parent.mkdir(parents=True, exist_ok=True)
    corpus = shards.parent / "corpus.jsonl"
    for args in (
        ["sample-corpus", str(corpus), "--max-size", str(corpus_bytes)],
        ["convert", str(corpus), "--output", str(shards), "-q"],
    ):
        subprocess.run([sys.executable, "-m", "shardtok", *args], check=True)


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(input_ids)))


def to_device(batch: dict, device: torch.device) -> dict:
    # Plain values (max_seqlen, use_cache, ...) ride along with the tensors.
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a shardtok dataset folder")
    p.add_argument("--make-data", action="store_true", help="write the dataset and exit")
    p.add_argument("--corpus-bytes", type=int, default=400_000)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    if args.make_data:
        make_data(args.data, args.corpus_bytes)
        return

    # A rank that dies or falls out of step fails the others after this long, not never.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)

    # No rank or world_size here: they come from the process group.
    ds = ShardStreamDataset(args.data, seq_len=SEQ_LEN, batch_size=BATCH)
    vocab = ds.source.manifest.vocab_size
    loader = ShardLoader(ds, num_workers=1)
    # Every rank has the same len(loader), so stopping on it keeps the ranks in step.
    steps = min(args.steps, len(loader))
    model = DistributedDataParallel(TinyLM(vocab).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    first = None
    batches = iter(loader)
    try:
        for step in range(1, steps + 1):
            batch = to_device(next(batches), device)
            if first is None:
                first = batch["input_ids"].clone()  # the slot is reused by the worker
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(
                logits.view(-1, vocab), batch["labels"].view(-1), ignore_index=-100
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages the gradients across ranks here
            optimizer.step()
            print(f"rank {rank} step {step}: loss {loss.item():.3f}", flush=True)
    finally:
        batches.close()

    firsts = [torch.empty_like(first) for _ in range(world)]
    dist.all_gather(firsts, first)
    for other in range(world):
        if other != rank:
            assert not torch.equal(firsts[other], first), f"ranks {rank}, {other}: same batch"
    weights = model.module.head.weight.detach()
    gathered = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    assert all(torch.equal(w, weights) for w in gathered), "DDP let the weights drift apart"
    if rank == 0:
        print(f"{world} ranks, {steps} steps each: different batches, equal weights", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    # torchrun sets these; a bare `python torchrun_ddp.py DATA` would wait for peers instead.
    if "--make-data" not in sys.argv and "RANK" not in os.environ:
        sys.exit("run it under torchrun: torchrun --nproc-per-node 2 " + " ".join(sys.argv))
    main()
