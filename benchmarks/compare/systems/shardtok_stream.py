"""shardtok, streaming: zstd tar shards written by DatasetWriter, read by `shardtok.torch.
ShardStreamDataset` (shard permutation per epoch, token-exact slices per worker, document
shuffle buffer, concat packing, batches built in the worker) under `shardtok.torch.ShardLoader`,
the DataLoader subclass shardtok recommends for it (same batches as `DataLoader(batch_size=None)`,
handed over through shared memory and a pipe per worker). The stream options are the library's
defaults."""

from __future__ import annotations

from pathlib import Path

from shardtok.format import DatasetWriter, MegatronPair
from shardtok.torch import ShardLoader, ShardStreamDataset

LABEL = "shardtok stream"
LAYOUT = "zstd tar shards (level 3, 1 MiB frames); ShardStreamDataset(concat, default shuffle buffer); ShardLoader (a DataLoader)"


def write(source, out: Path, options, compression_level: int | None = 3) -> None:
    pair = MegatronPair(source.prefix)
    with DatasetWriter(
        out,
        vocab_size=source.vocab_size,
        tokenizer={"name": source.name, "eos_id": source.eos_id},
        shard_size=options.shard_bytes,
        frame_size=options.frame_bytes,
        compression_level=compression_level,
        dtype=source.dtype,
    ) as writer:
        for i in range(len(pair)):
            writer.add(pair[i])


def loader(out: Path, source, options):
    dataset = ShardStreamDataset(
        out, seq_len=options.seq_len, batch_size=options.batch_size, seed=options.seed
    )
    return ShardLoader(dataset, num_workers=options.num_workers)


def training_inputs(batch):
    return batch["input_ids"], batch["labels"], batch["position_ids"]
