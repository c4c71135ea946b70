"""Fine-tune a tiny Llama with ``transformers.Trainer`` on packed fine-tuning shards.

Shows the Trainer path: a ``ShardStreamDataset`` built *without* ``batch_size`` yields single
packed sequences (several conversations per row, labels in the Hugging Face layout) and the
Trainer's own DataLoader batches them. The script makes its own data with the CLI (a sample
chat corpus, converted with ``docs/sft/chat.yaml``), trains a 2-layer Llama for a few dozen
steps on the CPU, checks that the loss went down, and checks that the packed conversations
did not see each other: each one's logits inside a packed row equal its logits alone.

Run (from the repository root, a minute or less on a laptop CPU):

    python examples/hf_trainer_sft.py --out /tmp/sft-example
    python examples/hf_trainer_sft.py --out /tmp/sft-example --max-steps 200   # train longer

Needs ``transformers`` and ``accelerate`` (``pip install transformers accelerate``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
import transformers

from shardtok.torch import ShardStreamDataset

REPO = Path(__file__).resolve().parents[1]
SFT_CONFIG = REPO / "docs" / "sft" / "chat.yaml"
SEQ_LEN = 256
BATCH = 4


def shardtok(*args: str) -> None:
    # The CLI in a child process, exactly as a user would type it.
    subprocess.run([sys.executable, "-m", "shardtok", *args], check=True)


def make_data(out: Path, corpus_bytes: int, sft_config: Path) -> Path:
    shards = out / "chat"
    if (shards / "index.json").exists():  # made by an earlier run
        return shards
    if not sft_config.is_file():
        raise SystemExit(f"no SFT config at {sft_config}: pass --sft-config (docs/sft/chat.yaml)")
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "chat.jsonl"
    shardtok("sample-corpus", "--chat", str(corpus), "--max-size", str(corpus_bytes))
    # skip: a sample conversation the template cannot render is logged to rejects.jsonl
    # rather than failing the whole conversion.
    shardtok("convert", str(corpus), "--output", str(shards), "--sft", str(sft_config),
             "--on-bad-record", "skip", "-q")  # fmt: skip
    return shards


def tiny_llama(vocab_size: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    # use_cache stays as shipped (True). A model that makes a KV cache lets packed documents
    # attend to each other; the Trainer turns it off (TrainingArguments.use_cache defaults to
    # False), and check_isolation below would catch a version that did not.
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def check_isolation(trainer: transformers.Trainer, ds: ShardStreamDataset) -> int:
    """Every document of the Trainer's first batch: logits in the packed row == logits alone.
    Returns how many documents were compared."""
    model = trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    # The Trainer keeps only the model's own arguments, so document_ids are gone from its
    # batch: the same first rows, streamed again from the start, name the segments.
    it = iter(ds)
    rows = [next(it) for _ in range(BATCH)]
    assert torch.equal(batch["input_ids"].cpu(), torch.stack([r["input_ids"] for r in rows]))
    compared = 0
    with torch.no_grad():
        packed = model(**batch).logits
        for row, sample in enumerate(rows):
            docs = sample["document_ids"]
            for doc in torch.unique(docs):
                where = torch.nonzero(docs == doc).flatten()
                alone = model(input_ids=sample["input_ids"][where][None]).logits[0]
                torch.testing.assert_close(packed[row, where], alone, rtol=0, atol=1e-4)
                compared += 1
    return compared


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the data and trainer")
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--corpus-bytes", type=int, default=400_000)
    p.add_argument(
        "--sft-config",
        type=Path,
        default=SFT_CONFIG,
        help="how records become conversations, which tokens train (docs/sft/chat.yaml)",
    )
    args = p.parse_args(argv)

    shards = make_data(args.out, args.corpus_bytes, args.sft_config)
    # No batch_size: single sequences for the Trainer to batch. labels_format="hf" because a
    # *ForCausalLM shifts labels itself (shifted labels would train two tokens ahead).
    ds = ShardStreamDataset(shards, seq_len=SEQ_LEN, labels_format="hf", packing="greedy")
    model = tiny_llama(ds.source.manifest.vocab_size)

    targs = transformers.TrainingArguments(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=BATCH,
        max_steps=args.max_steps, learning_rate=3e-3, warmup_steps=0, logging_steps=5,
        report_to=[], use_cpu=True, save_strategy="no", dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=ds)
    trainer.train()

    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    print(f"logged losses: {', '.join(f'{x:.3f}' for x in losses)}")
    assert len(losses) >= 2, "too few steps to compare losses"
    assert losses[-1] < losses[0], f"the loss did not decrease: {losses}"

    compared = check_isolation(trainer, ds)
    print(f"isolation: {compared} packed documents match their logits alone (atol 1e-4)")
    return {"losses": losses, "documents_compared": compared}


if __name__ == "__main__":
    main()
