"""A plain PyTorch training loop that checkpoints and resumes exactly, data position included.

Shows: ``ShardLoader(ShardStreamDataset(..., batch_size=8), num_workers=2)`` feeding a loop
that computes its own loss from the default ``labels_format="shifted"`` labels; a checkpoint
holding the model, the optimizer and ``loader.state_dict()`` (plain data, so
``torch.load(weights_only=True)`` reads it); and a restart in a *new process* that loads all
three and carries on. The script proves the point: it trains `--steps` steps without a
break, then again with a checkpoint at `--save-at` and a resume in a child process, and
asserts that the resumed run saw bit-for-bit the same batches and ended with bit-for-bit the
same weights.

Run (from the repository root; it makes its own data with the CLI):

    python examples/train_loop_resume.py --out /tmp/resume-example
    python examples/train_loop_resume.py --out /tmp/resume-example --steps 40 --save-at 17

In your own job only the ``train(...)`` function matters: call it with ``checkpoint`` to
save, and after a crash with ``resume`` pointing at the last checkpoint.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from shardtok.torch import ShardLoader, ShardStreamDataset

SEQ_LEN = 128
BATCH = 8
WORKERS = 2


def shardtok(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "shardtok", *args], check=True)


def make_data(out: Path, corpus_bytes: int) -> Path:
    shards = out / "shards"
    if (shards / "index.json").exists():  # made by an earlier run
        return shards
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.jsonl"
    shardtok("sample-corpus", str(corpus), "--max-size", str(corpus_bytes))
    shardtok("convert", str(corpus), "--output", str(shards), "-q")
    return shards


class TinyLM(nn.Module):
    """A bigram language model: enough to have weights and an optimizer state to restore."""

    def __init__(self, vocab_size: int, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(input_ids)))


def train(
    shards: Path,
    steps: int,
    *,
    checkpoint: Path | None = None,
    save_at: int | None = None,
    resume: Path | None = None,
) -> tuple[list[torch.Tensor], nn.Module]:
    """Train up to step `steps` (1-based, counted from the start of training), saving a
    checkpoint after step `save_at` when asked, or continuing from `resume`. Returns the
    input_ids of every batch trained here, and the model."""
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    ds = ShardStreamDataset(shards, seq_len=SEQ_LEN, batch_size=BATCH)
    vocab = ds.source.manifest.vocab_size
    model = TinyLM(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = ShardLoader(ds, num_workers=WORKERS)
    done = 0
    if resume is not None:
        # weights_only: the loader's state is plain data (dicts, lists, numbers, strings),
        # so the checkpoint needs no pickle trust.
        saved = torch.load(resume, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # the next batch is the one after step k
        done = saved["step"]
    assert steps <= len(loader), f"one epoch here is {len(loader)} steps; ask for fewer"

    seen = []
    batches = iter(loader)
    try:
        for step in range(done + 1, steps + 1):
            batch = next(batches)
            # The batch lives in a shared-memory slot the worker reuses: keep a copy.
            seen.append(batch["input_ids"].clone())
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(
                logits.view(-1, vocab), batch["labels"].view(-1), ignore_index=-100
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"step {step}: loss {loss.item():.3f}")
            if checkpoint is not None and step == save_at:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    # Taken right after the step's batch: the position of the last batch the
                    # loop consumed, not of what the workers have prefetched.
                    "loader": loader.state_dict(),
                    "step": step,
                }
                tmp = checkpoint.with_suffix(".tmp")
                torch.save(state, tmp)
                tmp.replace(checkpoint)  # a crash mid-write never leaves half a checkpoint
                print(f"checkpoint after step {step}: {checkpoint}")
                break  # stands in for the job dying here
    finally:
        batches.close()  # stops the workers of an epoch left early
    return seen, model


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for data and checkpoints")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-at", type=int, default=6)
    p.add_argument("--corpus-bytes", type=int, default=400_000)
    # Used by the script itself to resume in a fresh process, as a restarted job would.
    p.add_argument("--resume", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    assert 0 < args.save_at < args.steps

    shards = make_data(args.out, args.corpus_bytes)
    if args.resume is not None:
        seen, model = train(shards, args.steps, resume=args.resume)
        torch.save({"batches": seen, "model": model.state_dict()}, args.record)
        return {}

    print("uninterrupted run")
    full, full_model = train(shards, args.steps)

    print(f"run stopped after step {args.save_at}")
    checkpoint = args.out / "checkpoint.pt"
    before, _ = train(shards, args.steps, checkpoint=checkpoint, save_at=args.save_at)

    print("resumed in a new process")
    record = args.out / "resumed.pt"
    subprocess.run(
        [sys.executable, __file__, "--out", str(args.out), "--steps", str(args.steps),
         "--resume", str(checkpoint), "--record", str(record)],
        check=True,
    )  # fmt: skip
    resumed = torch.load(record, weights_only=True)

    assert len(before) == args.save_at
    assert len(resumed["batches"]) == args.steps - args.save_at
    for step, (got, want) in enumerate(zip(before + resumed["batches"], full), start=1):
        assert torch.equal(got, want), f"step {step}: the batch differs from the uninterrupted run"
    want_weights = full_model.state_dict()
    for name, got in resumed["model"].items():
        assert torch.equal(got, want_weights[name]), f"{name} differs from the uninterrupted run"
    print(
        f"resume exact: batches {args.save_at + 1}..{args.steps} and the final weights equal "
        "the uninterrupted run's, bit for bit"
    )
    return {"steps": args.steps, "save_at": args.save_at}


if __name__ == "__main__":
    main()
